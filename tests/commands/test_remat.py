"""``zoo residuals`` (zoo.commands.remat): its flags reach the report as given."""

from __future__ import annotations

import json

from tests.e2e.clikit import refused
from zoo.cli import main


def test_residuals_layers_zero_is_the_layer_count_given_never_the_presets(capsys):
    """Issue 60, item 11: ``--layers 0`` reported the preset's layers (0 was read as unset).
    An MLP of no hidden layer is a model, so 0 reaches the report; a transformer refuses it."""
    assert main(["residuals", "mlp-s", "--remat", "none", "--layers", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_layers"] == 0
    refused(capsys, ["residuals", "transformer-s", "--remat", "none", "--layers", "0"], "num_layers", "0")
    refused(capsys, ["residuals", "transformer-s", "--remat", "none", "--layers", "-3"], "num_layers", "-3")


def test_bench_remat_layers_zero_goes_to_the_model_never_the_presets_count(capsys):
    """``zoo bench remat --layers 0`` ran the preset's 4 layers and said L=4 (0 read as unset)."""
    refused(
        capsys, ["bench", "remat", "transformer-s", "--policies", "none", "--layers", "0"], "num_layers", "0"
    )
