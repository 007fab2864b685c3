"""Which dtype a checkpoint stores each leaf in, and what an HF export says it wrote.

The rule (docs/precision.md): a leaf is stored as the run holds it. What trains is held as its
float32 master copy, whatever dtype it was imported or saved in; what is wholly frozen is held
in the run's compute dtype, ``Precision.held`` (bfloat16 runs: bf16, a bf16 import never widened;
float32 runs: float32, a bf16 leaf widened). A stacked leaf with some frozen
layers is one array, and it trains: float32, its bf16 frozen rows widened exactly."""

import json

import pytest
from safetensors.numpy import load_file

from tests.tiny import HF_FIXTURES as FIXTURES
from tests.tiny import TINY
from zoo.cli import main
from zoo.models.paths import flat_by_path
from zoo.train import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hf")]
AS_FULL = ["--set", "lora.rank=0", "--set", "lora.targets=[]"]


@pytest.fixture(scope="module")
def bf16_import(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bf16-import")
    (tmp / "t.txt").write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    assert (
        main(["import", str(FIXTURES / "llama-bf16"), "--out", str(tmp / "imp"), "--dtype", "bfloat16"]) == 0
    )

    def train(name, *flags):
        out = tmp / name
        argv = ["train", "hf-lm-lora", "--init-from", str(tmp / "imp"), "--dataset", f"text:{tmp / 't.txt'}"]
        vocab = f"--set=data.vocabulary=hf:{FIXTURES / 'llama3-tied'}"
        assert main([*argv, vocab, "--out", str(out), *TINY, *flags]) == 0
        return out

    return train


def stored(run_dir) -> dict:
    return {p: str(v.dtype) for p, v in flat_by_path(checkpoint.load_checkpoint(run_dir).params).items()}


def test_a_float32_fine_tune_of_a_bf16_import_stores_float32(bf16_import):
    dtypes = stored(bf16_import("full", *AS_FULL))
    assert set(dtypes.values()) == {"float32"}, dtypes
    frozen = stored(bf16_import("frozen-f32", *AS_FULL, '--set=freeze.patterns=["embed"]'))
    assert set(frozen.values()) == {"float32"}, frozen  # held, computed and stored in float32


def test_stored_as_held_for_frozen_partly_frozen_and_lora_base(bf16_import):
    freeze = '--set=freeze.patterns=["embed", "blocks[:1]"]'
    dtypes = stored(bf16_import("mixed", *AS_FULL, "--precision", "bfloat16", freeze))
    assert dtypes["embed.w"] == "bfloat16"  # wholly frozen: held in bf16
    assert dtypes["blocks.attn.q.w"] == dtypes["blocks.mlp.up.w"] == "float32"  # layer 1 trains
    assert dtypes["head.w"] == dtypes["norm_f.scale"] == "float32"  # trains
    lora = stored(bf16_import("lora", "--precision", "bfloat16"))
    assert {d for p, d in lora.items() if ".lora_" in p} == {"float32"}  # the adapters train
    assert {d for p, d in lora.items() if ".lora_" not in p} == {"bfloat16"}  # the base is frozen


def test_an_hf_export_states_the_dtype_of_every_tensor(bf16_import, tmp_path):
    run = bf16_import("mixed-export", *AS_FULL, "--precision", "bfloat16", '--set=freeze.patterns=["embed"]')
    assert set(stored(run).values()) == {"float32", "bfloat16"}  # a mixed checkpoint
    out = tmp_path / "hf"
    assert main(["export", str(run), "--format", "hf", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    assert {str(t.dtype) for t in tensors.values()} == {config["torch_dtype"]}
