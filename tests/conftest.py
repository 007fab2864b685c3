import os
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo.losses import per_example_loss
from zoo.models.canonical import canonical_shapes
from zoo.models.paths import nest_by_path

# XLA's CPU backend at optimisation level 0 compiles the suite's small programs about twice as
# fast. It changes how LLVM schedules the float math, not what is computed: results move far
# inside the float rule (tests/numerics.py), which is what every comparison between two
# programs uses. Claims that are about the compiled program itself (memory, HLO) compile as usual.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def fast_jit(fn, **kwargs):
    """``jax.jit`` with :data:`FAST_COMPILE`."""
    return jax.jit(fn, compiler_options=FAST_COMPILE, **kwargs)


def random_params(shapes, seed=0) -> dict:
    """A canonical tree of distinct random values for a config (or a ``{path: shape}`` dict),
    fan-in scaled like ``init_params`` but drawn by numpy, so that nothing has to be compiled
    (the library's jitted init costs seconds of XLA compile per config)."""
    if not isinstance(shapes, dict):
        shapes = canonical_shapes(shapes)
    rng = np.random.default_rng(seed)
    flat = {}
    for path, shape in shapes.items():
        value = rng.standard_normal(shape, dtype=np.float32)
        if path.endswith(".w") and not path.startswith(("embed.", "pos.")):
            value *= shape[-2] ** -0.5
        elif path.endswith(".scale"):
            value = 1 + 0.1 * value
        else:
            value *= 0.1
        flat[path] = jnp.asarray(value)
    return nest_by_path(flat)


def labels_for(cfg, x, seed=1):
    """Random valid labels for a model input."""
    return zoo.example_labels(cfg, x, seed)


def loss_of(cfg, backend, remat="none"):
    """Mean cross-entropy of canonical params on (x, y): the quantity tests differentiate."""
    apply = zoo.apply_fn(cfg, backend)

    def loss(params, x, y):
        return per_example_loss(apply(params, x, remat), y).mean()

    return loss


def reduction_size(cfg, batch):
    """The float rule's ``n`` (tests/numerics.py) for a model's logits, losses and gradients:
    examples x positions x the widest contraction (the largest fan-in of a canonical leaf)."""
    widths = [shape[-2] for shape in canonical_shapes(cfg).values() if len(shape) >= 2]
    return batch * (cfg.max_len or 1) * max(widths)


@pytest.fixture(scope="session")
def small_transformer():
    return zoo.get_config("transformer-xs", num_layers=2, d_model=32, d_ff=64, max_len=16, vocab_size=40)


# tests/e2e/parallel runs on a mesh of 8 simulated CPU devices. `make test` gives that folder a
# pytest session of its own under XLA_FLAGS=--xla_force_host_platform_device_count=8 (the flag
# must be set before JAX starts); in a session with fewer devices its tests skip.
MESH_DEVICES = 8


def pytest_collection_modifyitems(config, items):
    if jax.device_count() >= MESH_DEVICES:
        return
    skip = pytest.mark.skip(
        reason=f"needs {MESH_DEVICES} devices: XLA_FLAGS=--xla_force_host_platform_device_count={MESH_DEVICES}"
    )
    for item in items:
        if "tests/e2e/parallel/" in str(item.fspath):
            item.add_marker(skip)


# JAX's persistent compilation cache, on for the whole run: one folder that every xdist worker
# and every child process (a CLI run, a bench) shares, so a program compiled once in the run
# (the same tiny recipe trained by many CLI tests, the two runs of a pair of neighbouring
# datasets, a doc's command and the test of that command) is read back instead of compiled
# again. It changes which compile an executable comes from, not what it computes: the cache's
# key is the program, its compile options, the devices and the XLA flags. A read-back still
# counts as one compile (JAX times both as a backend compile, which `CompileCounter` counts).
# The folder is new for each run and removed after it; `ZOO_TEST_COMPILE_CACHE` passes it on.
CACHE_ENV = "ZOO_TEST_COMPILE_CACHE"
_CACHE_SETTINGS = {
    "jax_compilation_cache_dir": "JAX_COMPILATION_CACHE_DIR",
    "jax_persistent_cache_min_compile_time_secs": "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "jax_persistent_cache_min_entry_size_bytes": "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
}


def _cache_values(folder) -> dict:
    return {
        "jax_compilation_cache_dir": None if folder is None else str(folder),
        "jax_persistent_cache_min_compile_time_secs": 0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }


def _use_cache(values: dict) -> None:
    from jax._src import compilation_cache

    compilation_cache.reset_cache()
    for name, value in values.items():
        jax.config.update(name, value)


def pytest_configure(config):
    folder = os.environ.get(CACHE_ENV)
    if folder is None:  # the first process of the run (the xdist controller, or the only one)
        folder = tempfile.mkdtemp(prefix="zoo-jax-cache-")
        config._zoo_cache_made = folder
        os.environ[CACHE_ENV] = folder
    values = _cache_values(folder)
    for name, env in _CACHE_SETTINGS.items():  # for the children: a CLI run, a bench
        os.environ[env] = str(values[name])
    _use_cache(values)


def pytest_unconfigure(config):
    made = getattr(config, "_zoo_cache_made", None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def no_compile_cache():
    """The persistent cache off for one test: for a test that compares what two runs record of
    their own compiles (a profile's events), which differ when one run compiles and the other
    reads back. Children it starts still inherit the cache."""
    before = {name: getattr(jax.config, name) for name in _CACHE_SETTINGS}
    _use_cache(_cache_values(None))
    try:
        yield
    finally:
        _use_cache(before)
