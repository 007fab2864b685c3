"""Recipes sized for an accelerator fit it at their shipped shapes, by analysis on a CPU
(benchmarks/device/recipe_fits.py).

A recipe says what it is sized for with ``device_memory`` (a top-level key: ``"15.75GiB"``, one
TPU v5e chip's). What these tests promise:

- every recipe whose description calls it an accelerator run declares ``device_memory`` (and
  no other does), and the declaration survives the recipe's TOML round trip;
- (every CI pass) the arguments each of its device programs keeps in device memory (params,
  the optimizer state it does not offload, frozen weights, a batch) fit the declaration. Exact
  bytes from shapes, nothing compiled; a necessary condition only: it misses temporaries;
- (``slow``, where ``libtpu`` of the installed JAX's version is installed: the chip image's
  JAX 0.10.2 with libtpu 0.0.42.1) each program's footprint from the TPU compiler's own
  ``memory_analysis()``, compiled for a TPU v5e without one, fits. That figure is the chip's
  (8,699 MiB of temporaries for gpt2-124m-tokens here, 8,698 on the chip); it does not cover
  what runs outside the compiled programs (the host's update, a checkpoint's copies, XLA's
  runtime reservations, fragmentation), so a program within a few hundred MiB of the limit may
  still fail on the chip. About 90-100 s of one core per training program, 15-40 s per eval
  program.

The CPU's own compiler is not used for the footprint: its figures are not the chip's in
either direction (recipe_fits.py's docstring has the two cases), so a test on them could pass a
recipe the chip refuses, or fail one that fits.
"""

from __future__ import annotations

import importlib
import math
import sys
import tomllib
from pathlib import Path

import jax
import pytest

from zoo import recipes

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "recipe_fits.py"


def _module():
    if str(SCRIPT.parent) not in sys.path:  # a plain script beside its kin (fits_table.py, ...)
        sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module(SCRIPT.stem)


DECLARED = sorted(r.name for r in recipes.list_recipes() if r.device_memory is not None)


def test_the_recipes_that_say_accelerator_declare_the_memory_they_are_sized_for():
    for recipe in recipes.list_recipes():
        says = "accelerator" in recipe.description.lower()
        assert says == (recipe.device_memory is not None), recipe.name
    assert "llama-1b-tokens" in DECLARED and "gpt2-124m-tokens" in DECLARED
    for name in DECLARED:
        recipe = recipes.load_recipe(name)
        assert recipes.parse_recipe(tomllib.loads(recipes.to_toml(recipe)), name) == recipe


@pytest.mark.parametrize("name", DECLARED)
def test_what_each_program_keeps_in_device_memory_fits_the_declaration(name):
    fits = _module()
    recipe = recipes.load_recipe(name)
    device = jax.devices("cpu")[0]
    for program, (_, args) in fits.programs(recipe, device).items():
        kept = sum(
            math.prod(a.shape) * a.dtype.itemsize
            for a in jax.tree.leaves(args)
            if getattr(a.sharding, "memory_kind", None) != "pinned_host"
        )
        assert 0 < kept <= recipe.device_memory, (name, program, kept)


def _tpu_device(fits):
    try:
        import libtpu  # noqa: F401
    except ImportError:
        pytest.skip("libtpu is not installed (pip install libtpu==0.0.42.1 beside JAX 0.10.2)")
    try:
        return fits.target_device("tpu-v5e")
    except Exception as error:  # noqa: BLE001 - a libtpu that cannot describe the chip
        pytest.skip(f"no compile-only TPU v5e here: {type(error).__name__}: {error}")


@pytest.mark.slow
@pytest.mark.parametrize("name", DECLARED)
def test_each_program_fits_by_the_tpu_compilers_own_analysis(name):
    fits = _module()
    device = _tpu_device(fits)
    rows = fits.measure(recipes.load_recipe(name), device)
    assert rows and all(row["fits"] for row in rows), rows
