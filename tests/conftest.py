import contextlib

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


@pytest.fixture(scope="session")
def compile_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("jax-cache")


_CACHE_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@contextlib.contextmanager
def _persistent_cache(folder):
    """JAX's persistent compilation cache in ``folder`` (None: off) until the block ends, then
    the settings as they were."""
    from jax._src import compilation_cache

    before = {name: getattr(jax.config, name) for name in _CACHE_SETTINGS}
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", None if folder is None else str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:
        yield
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


@pytest.fixture(scope="module")
def compile_cache(compile_cache_dir):
    """JAX's persistent compilation cache on for one module's tests, so that programs compiled
    again with the same HLO (the two runs of a pair of neighbouring datasets, the same CLI run
    in several tests or modules) are read back instead of compiled. It changes which compile an
    executable comes from, not what it computes; the cache is off again after the module. One
    folder per session (per xdist worker)."""
    with _persistent_cache(compile_cache_dir):
        yield


@pytest.fixture
def compile_cache_in_test(tmp_path):
    """The persistent cache on for one test, in a folder of its own: for a test that compiles the
    same programs several times (a search, then the run and the bench that search again)."""
    with _persistent_cache(tmp_path / "jax-cache"):
        yield


@pytest.fixture
def no_compile_cache():
    """The persistent cache off for one test of a module that has it on: for a test that compares
    what two runs record of their own compiles (a profile's events), which differ when one run
    compiles and the other reads back."""
    with _persistent_cache(None):
        yield
