"""The built-in model kinds. Importing this package registers them (``zoo.models.registry``).

A new kind is one module here (its config class and presets) plus one model file per backend.
"""

from zoo.models.kinds import mlp, transformer  # noqa: F401
