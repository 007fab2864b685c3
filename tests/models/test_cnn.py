"""The CNN kind beyond what the registry-generated tests check: the preset is Opacus's
SampleConvNet, the conv and pool ops against float64 NumPy, remat on a stack-less network, and
a DP run of the whole CLI on tiny MNIST-format files."""

import json
import struct

import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit
from tests.numerics import assert_close
from zoo.cli import main
from zoo.errors import ZooError
from zoo.models import canonical, ops
from zoo.residuals import residual_report


def test_cnn_mnist_is_opacus_sample_convnet():
    cfg = zoo.get_config("cnn-mnist")
    shapes = canonical.canonical_shapes(cfg)
    assert shapes == {
        "conv1.w": (8, 8, 1, 16), "conv1.b": (16,), "conv2.w": (4, 4, 16, 32), "conv2.b": (32,),
        "in_proj.w": (512, 32), "in_proj.b": (32,), "head.w": (32, 10), "head.b": (10,),
    }  # fmt: skip
    assert sum(int(np.prod(s)) for s in shapes.values()) == 26_010
    assert cfg.sides() == (14, 13, 5, 4) and cfg.activation_names == ("logits",)
    with pytest.raises(ZooError, match="too small for this CNN"):
        zoo.get_config("cnn-mnist", image_size=8)


def conv_reference(x, w, b, stride, pad):
    """Float64 NHWC conv by explicit windows (PyTorch's Conv2d arithmetic)."""
    x = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw, _, out = w.shape
    oh, ow = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
    z = np.zeros((x.shape[0], oh, ow, out))
    for i in range(oh):
        for j in range(ow):
            window = x[:, i * stride : i * stride + kh, j * stride : j * stride + kw, :]
            z[:, i, j] = np.einsum("bhwc,hwco->bo", window, w.astype(np.float64))
    return z + b


@pytest.mark.numerics
def test_conv_and_max_pool_match_float64_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 9, 9, 3)).astype(np.float32)
    params = {
        "w": (rng.standard_normal((4, 4, 3, 5)) / 6).astype(np.float32),
        "b": rng.standard_normal(5).astype(np.float32),
    }
    from flax import nnx

    layer = nnx.Conv(3, 5, (4, 4), strides=(2, 2), padding=((1, 1), (1, 1)), rngs=nnx.Rngs(0))
    layer.kernel[...], layer.bias[...] = params["w"], params["b"]
    z = fast_jit(lambda x: ops.conv(layer, x))(x)
    expected = conv_reference(x, params["w"], params["b"], 2, 1)
    assert_close(np.asarray(z), expected, n=4 * 4 * 3, what="conv")
    pooled = np.asarray(ops.max_pool(z, 2, 1))
    ref = np.max([expected[:, i : i + 3, j : j + 3] for i in range(2) for j in range(2)], axis=0)
    assert_close(pooled, ref, n=4 * 4 * 3, what="max pool")


def test_remat_policies_change_nothing_without_a_stack():
    """cnn-mnist has no scanned stack (num_layers=0): every policy keeps what `none` keeps."""
    kept = {
        policy: residual_report("cnn-mnist", policy, batch=4)["total_device_bytes"]
        for policy in ("none", "full", "offload-layer-input")
    }
    assert len(set(kept.values())) == 1, kept


def write_idx(path, array):
    path.write_bytes(
        struct.pack(">BBBB", 0, 0, 8, array.ndim)
        + struct.pack(f">{array.ndim}I", *array.shape)
        + array.tobytes()
    )


# The small CNN's geometry on 8x8 images (the preset needs 28x28): compiles in a fraction.
SMALL = {"conv1_kernel": 3, "conv1_stride": 1, "conv1_padding": 1, "conv2_kernel": 3, "conv1_features": 3}
SMALL_GEOMETRY = [arg for key, value in SMALL.items() for arg in ("--set", f"model.{key}={value}")]


def test_dp_training_of_the_cnn_through_the_cli(tmp_path, capsys):
    rng = np.random.default_rng(1)
    data = tmp_path / "idx"
    data.mkdir()
    for split, n in (("train", 64), ("t10k", 16)):
        write_idx(data / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 8, 8), dtype=np.uint8))
        write_idx(data / f"{split}-labels-idx1-ubyte", (np.arange(n) % 10).astype(np.uint8))
    code = main([
        "train", "mnist-cnn-dp", "--dataset", f"idx:{data}", "--steps", "2", "--out", str(tmp_path / "run"),
        "--json", "--no-progress", "--set", "dp.expected_batch_size=16", "--set", "train.eval_every=2",
        "--set", "train.checkpoint_every=2", *SMALL_GEOMETRY,
    ])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    small = canonical.canonical_shapes(zoo.get_config("cnn-mnist", image_size=8, **SMALL))
    assert summary["model"] == "cnn-mnist"
    assert summary["trainable_params"] == sum(int(np.prod(shape)) for shape in small.values())
    assert summary["epsilon"] == pytest.approx(3.01) and 0.0 <= summary["eval_accuracy"] <= 1.0
