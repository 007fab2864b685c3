"""A new model kind is one folder: a toy kind written here into a temporary folder that joins
``zoo.models``'s search path, with no other file edited, is found by the registry and gets the
generic machinery -- the ``zoo models`` listing, the canonical tree in both backends, the
activation-name vocabulary and training steps through the engine.

The folder holds all a new kind needs: ``__init__.py``
(re-exports), ``config.py`` (config, presets, logical axes, ``register``), ``nnx.py`` and
``eqx.py``."""

import sys
import textwrap

import numpy as np
import pytest

import zoo
import zoo.models
from tests.conftest import fast_jit, labels_for, random_params, reduction_size
from tests.numerics import assert_bitwise_equal, assert_close
from zoo.commands.models import preset_rows
from zoo.configs import OptimConfig
from zoo.freeze import resolve_freeze
from zoo.jaxprs import checkpoint_names
from zoo.models import canonical, discover, registry
from zoo.train.engine import GradientSettings, make_engine
from zoo.train.start import config_start
from zoo.train.state import make_optimizer

KIND = "toykind"  # a folder name no built-in kind uses

FILES = {
    "__init__.py": '''
        """A toy kind for tests/models/test_discover.py."""

        from zoo.models.toykind.config import ToyConfig

        __all__ = ["ToyConfig"]
    ''',
    "config.py": '''
        """The toy kind: in_proj -> residual LayerNorm-dense-tanh blocks -> head."""

        from dataclasses import dataclass
        from typing import ClassVar

        import jax
        import jax.numpy as jnp

        from zoo import names
        from zoo.models.ops import check_features
        from zoo.models.registry import DataFit, ModelConfig, axes_from_table, register

        _AXES = {
            "in_proj.w": ("input", "embed"),
            "in_proj.b": ("embed",),
            "norm.scale": ("embed",),
            "norm.b": ("embed",),
            "dense.w": ("embed", "mlp"),
            "dense.b": ("mlp",),
            "head.w": ("embed", "classes"),
            "head.b": ("classes",),
        }


        @dataclass(frozen=True)
        class ToyConfig(ModelConfig):
            kind: ClassVar[str] = "toykind"
            activation_names: ClassVar[tuple[str, ...]] = (
                names.LAYER_INPUT, names.MLP_HIDDEN, names.MLP_OUT, names.LOGITS
            )
            d_in: int = 6
            width: int = 8
            num_layers: int = 2
            num_classes: int = 3

            @property
            def num_outputs(self) -> int:
                return self.num_classes

            def input_spec(self, batch, seq=None):
                return jax.ShapeDtypeStruct((batch, self.d_in), jnp.float32)

            def block_input_shape(self, batch, seq=None):
                return (batch, self.width)

            def check_input(self, x):
                check_features(x, self.d_in, "[B, d_in]")

            def fit_to_data(self, data: DataFit) -> dict:
                return {"d_in": data.num_features, "num_classes": data.num_classes}

            def logical_axes(self, path, ndim):
                return axes_from_table(_AXES, path, ndim)


        KIND = register(
            ToyConfig,
            nnx="zoo.models.toykind.nnx:Toy",
            eqx="zoo.models.toykind.eqx:Toy",
            presets={"toykind-xs": (ToyConfig(), "6-8-8-3 toy classifier (tests/models/test_discover.py)")},
        )
    ''',
    "nnx.py": '''
        """The toy kind in Flax NNX."""

        import jax
        import jax.numpy as jnp
        from flax import nnx
        from jax.ad_checkpoint import checkpoint_name

        from zoo import names
        from zoo.models import ops
        from zoo.models.toykind.config import ToyConfig
        from zoo.scan import Remat, scan_layers


        class Block(nnx.Module):
            """x + tanh(dense(norm(x)))."""

            def __init__(self, cfg: ToyConfig, *, rngs: nnx.Rngs):
                self.norm = nnx.LayerNorm(cfg.width, epsilon=1e-5, rngs=rngs)
                self.dense = nnx.Linear(cfg.width, cfg.width, rngs=rngs)

            def __call__(self, x: jax.Array) -> jax.Array:
                hidden = checkpoint_name(ops.dense(self.dense, ops.layer_norm(self.norm, x)), names.MLP_HIDDEN)
                return x + checkpoint_name(jnp.tanh(hidden), names.MLP_OUT)


        class Toy(nnx.Module):
            def __init__(self, cfg: ToyConfig, *, rngs: nnx.Rngs):
                self.cfg = cfg
                self.in_proj = nnx.Linear(cfg.d_in, cfg.width, rngs=rngs)

                @nnx.split_rngs(splits=cfg.num_layers)
                @nnx.vmap(in_axes=(0,), out_axes=0)
                def stacked_blocks(rngs: nnx.Rngs) -> Block:
                    return Block(cfg, rngs=rngs)

                self.blocks = stacked_blocks(rngs)
                self.head = nnx.Linear(cfg.width, cfg.num_classes, rngs=rngs)

            def stack(self):
                return ops.layer_stack(self.blocks)

            def __call__(self, x: jax.Array, *, remat: Remat = "none") -> jax.Array:
                self.cfg.check_input(x)
                h = scan_layers(*self.stack(), ops.dense(self.in_proj, x), remat)
                return checkpoint_name(ops.dense(self.head, h), names.LOGITS)
    ''',
    "eqx.py": '''
        """The toy kind in Equinox."""

        import equinox as eqx
        import jax
        import jax.numpy as jnp
        from jax.ad_checkpoint import checkpoint_name

        from zoo import names
        from zoo.models import ops
        from zoo.models.toykind.config import ToyConfig
        from zoo.scan import Remat, scan_layers


        class Block(eqx.Module):
            """x + tanh(dense(norm(x)))."""

            norm: eqx.nn.LayerNorm
            dense: eqx.nn.Linear

            def __init__(self, cfg: ToyConfig, *, key: jax.Array):
                self.norm = eqx.nn.LayerNorm(cfg.width, eps=1e-5)
                self.dense = eqx.nn.Linear(cfg.width, cfg.width, key=key)

            def __call__(self, x: jax.Array) -> jax.Array:
                hidden = checkpoint_name(ops.dense(self.dense, ops.layer_norm(self.norm, x)), names.MLP_HIDDEN)
                return x + checkpoint_name(jnp.tanh(hidden), names.MLP_OUT)


        class Toy(eqx.Module):
            in_proj: eqx.nn.Linear
            blocks: Block
            head: eqx.nn.Linear
            cfg: ToyConfig = eqx.field(static=True)

            def __init__(self, cfg: ToyConfig, *, key: jax.Array):
                k_in, k_blocks, k_head = jax.random.split(key, 3)
                self.cfg = cfg
                self.in_proj = eqx.nn.Linear(cfg.d_in, cfg.width, key=k_in)
                self.blocks = eqx.filter_vmap(lambda k: Block(cfg, key=k))(jax.random.split(k_blocks, cfg.num_layers))
                self.head = eqx.nn.Linear(cfg.width, cfg.num_classes, key=k_head)

            def stack(self):
                return ops.layer_stack(self.blocks)

            def __call__(self, x: jax.Array, *, remat: Remat = "none") -> jax.Array:
                self.cfg.check_input(x)
                h = scan_layers(*self.stack(), ops.dense(self.in_proj, x), remat)
                return checkpoint_name(ops.dense(self.head, h), names.LOGITS)
    ''',
}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy kind's folder, found by ``zoo.models.discover`` as ``zoo.models.toykind``;
    unregistered and forgotten afterwards."""
    root = tmp_path_factory.mktemp("kinds")
    (root / KIND).mkdir()
    for name, text in FILES.items():
        (root / KIND / name).write_text(textwrap.dedent(text).lstrip())
    assert KIND not in {k.name for k in registry.kinds()}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zoo.models, "__path__", [*zoo.models.__path__, str(root)])
        found = discover.import_kinds()
        try:
            yield found, registry.get_kind(KIND)
        finally:
            registry.unregister(KIND)
            for module in [
                m for m in sys.modules if m == f"zoo.models.{KIND}" or m.startswith(f"zoo.models.{KIND}.")
            ]:
                del sys.modules[module]
    assert KIND not in {k.name for k in registry.kinds()} and "toykind-xs" not in zoo.PRESETS


def test_the_folder_is_found_and_listed_after_the_built_in_kinds(toy):
    found, kind = toy
    assert KIND in found and {"mlp", "transformer", "llama"} <= set(found)
    assert [k.name for k in registry.kinds()][:3] == ["mlp", "transformer", "llama"]
    assert [k.name for k in registry.kinds()][-1] == KIND
    rows = {r["name"]: r for r in preset_rows()}  # what `zoo models` prints
    assert rows["toykind-xs"]["kind"] == KIND and rows["toykind-xs"]["num_layers"] == 2
    assert zoo.get_config("toykind-xs", width=16).width == 16
    assert kind.module_class("nnx").__module__ == f"zoo.models.{KIND}.nnx"
    assert kind.module_class("eqx").__module__ == f"zoo.models.{KIND}.eqx"


@pytest.mark.numerics
def test_canonical_tree_round_trips_and_both_backends_agree(toy):
    cfg = toy[1].small
    params = random_params(cfg, seed=3)
    assert set(canonical.canonical_shapes(cfg)) == {
        "in_proj.w", "in_proj.b", "blocks.norm.scale", "blocks.norm.b",
        "blocks.dense.w", "blocks.dense.b", "head.w", "head.b",
    }  # fmt: skip
    for backend in zoo.BACKENDS:
        back = zoo.to_canonical(zoo.from_canonical(cfg, backend, params))
        assert_bitwise_equal(back, params)
    x = zoo.example_batch(cfg, 4, seed=4)
    logits = {b: fast_jit(zoo.apply_fn(cfg, b))(params, x) for b in zoo.BACKENDS}
    assert logits["nnx"].shape == (4, cfg.num_classes)
    assert_close(logits["eqx"], logits["nnx"], n=reduction_size(cfg, 4), what="logits")
    for path, shape in canonical.canonical_shapes(cfg).items():
        assert len(cfg.logical_axes(tuple(path.split(".")), len(shape))) == len(shape)


def test_both_backends_tag_the_names_the_kind_declares(toy):
    cfg = toy[1].small
    params = random_params(cfg)
    x = zoo.example_batch(cfg, 2)
    found = {}
    for backend in zoo.BACKENDS:
        model = zoo.from_canonical(cfg, backend, params)
        found[backend] = checkpoint_names(lambda x, model=model: model(x), x)  # traced, not run
    assert found["nnx"] == found["eqx"] == set(cfg.activation_names)


@pytest.mark.parametrize("backend", zoo.BACKENDS)
def test_the_engine_trains_it(toy, backend):
    cfg = toy[1].small
    params = random_params(cfg, seed=1)
    plan = resolve_freeze(params, ())
    optimizer = make_optimizer(OptimConfig(name="sgd", lr=0.3, schedule="constant"), 10)
    engine = make_engine(
        config_start(cfg, params, freeze=plan), GradientSettings(backend, optimizer, remat="full")
    )
    state, frozen = engine.init_state(params, seed=0)
    x = np.asarray(zoo.example_batch(cfg, 16, seed=5))
    batch = {"x": x, "y": np.asarray(labels_for(cfg, x, seed=6)), "mask": np.ones(16, np.float32)}
    losses = []
    for _ in range(6):  # the same batch: plain SGD must lower its loss
        state, metrics = engine.train_step(state, frozen, batch)
        losses.append(float(metrics["loss"]))
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert int(state.step) == 6
