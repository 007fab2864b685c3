"""The built-in model kinds. Importing this package registers them (``zoo.models.registry``),
in this order, which is the order ``zoo models`` lists them in.

A new kind is one module here (its config class, presets and a small config for the tests)
plus one model file per backend.
"""

# isort: skip_file
from zoo.models.kinds import mlp  # noqa: F401
from zoo.models.kinds import transformer  # noqa: F401
from zoo.models.kinds import llama  # noqa: F401
