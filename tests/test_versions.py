"""pyproject.toml's version ranges against the two constraint files: CI's lock
(constraints.txt) lies inside every range, and the oldest set (constraints-oldest.txt, what
``make test-oldest`` installs) pins each dependency at its range's lower bound."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in project["dependencies"] + extras["dev"] + extras["tpu"]]


def pins(name: str) -> dict[str, str]:
    found = re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", (ROOT / name).read_text(), re.M)
    return {canonicalize_name(n): v for n, v in found}


def lower_bound(req: Requirement) -> str:
    (bound,) = [s.version for s in req.specifier if s.operator in (">=", "==")]
    return bound


@pytest.mark.parametrize("lock", ["constraints.txt", "constraints-oldest.txt"])
def test_each_constraint_file_pins_every_dependency_inside_its_range(lock):
    pinned = pins(lock)
    for req in requirements():
        version = pinned.get(canonicalize_name(req.name))
        assert version is not None, f"{lock} pins no {req.name}"
        assert req.specifier.contains(version, prereleases=True), (
            f"{lock}: {req.name}=={version} not in {req}"
        )


def test_the_oldest_set_is_every_range_s_lower_bound():
    pinned = pins("constraints-oldest.txt")
    for req in requirements():
        assert pinned[canonicalize_name(req.name)] == lower_bound(req), req


def test_the_tpu_extra_and_jax_share_one_range():
    by_name = {(r.name, tuple(sorted(r.extras))): r.specifier for r in requirements()}
    assert by_name[("jax", ("tpu",))] == by_name[("jax", ())] == by_name[("jaxlib", ())]
    assert lower_bound(Requirement(f"jax{by_name[('jax', ())]}")) == "0.10.2"  # the TPU v5e image's JAX
