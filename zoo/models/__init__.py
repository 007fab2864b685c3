"""Reference models: one folder per kind (``zoo/models/<kind>/``: its config and registration,
its Flax NNX module, its Equinox module), sharing a canonical parameter tree. Importing this
package registers every kind folder (``zoo.models.discover``)."""

from zoo.models.discover import import_kinds

import_kinds()
