"""The MLP kind beyond the registry-generated tests: its fixed input projection (``data.dp_pca``)
and one hidden layer without a stack, against a float64 NumPy forward pass."""

import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, random_params
from tests.numerics import assert_close
from zoo.errors import ZooError
from zoo.models import canonical


def numpy_forward(params, x):
    p = {k: {n: np.asarray(v, np.float64) for n, v in leaf.items()} for k, leaf in params.items()}
    h = np.asarray(x, np.float64) @ p["pca"]["w"]
    h = np.tanh(h @ p["in_proj"]["w"] + p["in_proj"]["b"])
    return h @ p["head"]["w"] + p["head"]["b"]


@pytest.mark.numerics
@pytest.mark.parametrize("backend", zoo.BACKENDS)
def test_a_projected_mlp_without_a_stack_is_pca_then_one_hidden_layer(backend):
    cfg = zoo.get_config(
        "mlp-s", d_in=20, d_hidden=16, num_layers=0, activation="tanh"
    ).with_input_projection(6)
    assert canonical.canonical_shapes(cfg) == {
        "pca.w": (20, 6), "in_proj.w": (6, 16), "in_proj.b": (16,), "head.w": (16, 10), "head.b": (10,),
    }  # fmt: skip
    assert cfg.input_projection == ("pca", "w") and cfg.activation_names == ("logits",)
    params = random_params(cfg, 2)
    x = np.random.default_rng(1).random((3, 20)).astype(np.float32)
    logits = fast_jit(zoo.apply_fn(cfg, backend))(params, x)
    assert_close(np.asarray(logits), numpy_forward(params, x), n=20, what="logits")


@pytest.mark.numerics
def test_the_forward_check_still_catches_a_skipped_projection():
    cfg = zoo.get_config("mlp-s", d_in=6, d_hidden=8, num_layers=0, activation="tanh").with_input_projection(
        6
    )
    params = random_params(cfg, 2)
    x = np.random.default_rng(1).random((3, 6)).astype(np.float32)
    skipped = {**params, "pca": {"w": np.eye(6, dtype=np.float32)}}  # planted: the projection ignored
    with pytest.raises(AssertionError):
        assert_close(
            np.asarray(fast_jit(zoo.apply_fn(cfg, "nnx"))(skipped, x)), numpy_forward(params, x), n=6
        )


def test_a_projection_wider_than_the_input_and_kinds_without_one_are_refused():
    with pytest.raises(ZooError, match="d_pca must be an int in"):
        zoo.get_config("mlp-s").with_input_projection(65)
    assert zoo.get_config("mlp-s").input_projection is None
    for preset in ("cnn-mnist", "transformer-digits"):
        assert zoo.get_config(preset).input_projection is None
        with pytest.raises(ValueError, match="has no fixed input projection"):
            zoo.get_config(preset).with_input_projection(4)
