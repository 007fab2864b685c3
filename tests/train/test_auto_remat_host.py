"""``--remat auto`` with the update on the host as a candidate placement: on an accelerator
(host memory apart from the device's) it is searched beside the in-program placements, its
need is its gradient program's alone (the masters and the optimizer state stay on the host),
its time is its whole step's, and a run that picks it trains with it.

A CPU is not such a machine: these tests fake a chip as ``test_auto_remat.py`` does (a device
that says it is a TPU with a ``bytes_limit``), so the candidates are those of a chip and each
need comes from a real CPU compile."""

import json

import jax
import numpy as np
import pytest

from tests.numerics import assert_bitwise_equal
from tests.train.test_auto_remat import ROWS, Chip, few_policies, marked, quick  # noqa: F401 (a fixture)
from zoo.errors import ZooError
from zoo.remat import footprint, step_bytes
from zoo.train import auto_remat, remat_search
from zoo.train.auto_remat import nothing_fits
from zoo.train.loop import train_recipe
from zoo.train.remat_search import HOST, Candidate, candidates
from zoo.train.run import build_run, train_batch

VALUES = {"train.remat": "auto", "train.batch_size": 64, "model.num_layers": 2, "train.log_every": 1}


def on_a_chip(monkeypatch, need_bytes: int) -> int:
    """Fake a chip whose budget (its ``bytes_limit`` less the margin) is ``need_bytes``."""
    limit = int(need_bytes / (1 - auto_remat.SAFETY)) + 1
    monkeypatch.setattr(auto_remat, "_device", lambda: Chip({"bytes_limit": limit, "peak_bytes_in_use": 1}))
    budget = int(limit * (1 - auto_remat.SAFETY))
    assert need_bytes <= budget < need_bytes + 2
    return budget


def losses(out) -> list[float]:
    return [
        r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]


@pytest.mark.usefixtures("few_policies")
def test_on_a_chip_the_update_on_the_host_is_picked_where_only_it_fits(tmp_path, monkeypatch):
    """A budget under every in-program candidate's need and over the update on the host's: it
    is searched, timed as its whole step (the gradient, the trips and the host's update, on a
    state the host holds), picked, and the run trains with it: its losses are bitwise those of
    a run made with ``--placement update-on-host`` and the chosen policy.

    The offloads sit out here: a CPU lowers their in-program copies to nothing, so their
    temporaries hold no device copy of the offloaded state and their CPU need is below what a
    chip needs (the update on the host's is its gradient program's on either)."""
    monkeypatch.setattr(auto_remat, "policy_names", lambda: ["none", "full"])
    monkeypatch.setattr(
        auto_remat, "PLACEMENTS", tuple(p for p in auto_remat.PLACEMENTS if p in ("none", HOST))
    )
    run = build_run(quick(**VALUES), choose_remat=False)
    probe = remat_search.search(
        run.engine, run.params, train_batch(run, 0), None, candidates(["none", "full"], ["none", HOST]),
        host_separate=True,
    )  # fmt: skip
    need = {r["label"]: r["need_bytes"] for r in probe}
    host = max(need["none/update-on-host"], need["full/update-on-host"])
    assert host < min(need["none/none"], need["full/none"]), need
    budget = on_a_chip(monkeypatch, host)

    real, timed = remat_search.time_candidates, {}

    def timed_then_table(steps, init, *args):
        """The real timing, kept, then a table's times: the choice between the two fitting
        host candidates is the table's (full), whatever this machine's clock says."""
        timed.update({c.label: t for c, t in real(steps, init, *args).items()})
        for step in steps.values():  # each takes the host's whole state and updates it
            state, metrics = step(*init())
            assert int(state.step) == 1 and jax.tree.leaves(state.opt_state) and "loss" in metrics
        return {c: [(1 if c.policy == "full" else 2) / 1e3] * 3 for c in steps}

    monkeypatch.setattr(remat_search, "time_candidates", timed_then_table)
    summary = train_recipe(quick(**VALUES), tmp_path / "auto", show_progress=False)
    chosen = summary["remat_auto"]
    assert (chosen["policy"], chosen["offload"]) == ("full", HOST)
    assert summary["placement"] == HOST and summary["remat"] == "auto:full"
    assert all(timed[label] for label in ("none/update-on-host", "full/update-on-host"))  # both ran
    table = {f"{r['policy']}/{r['offload']}": r for r in chosen["candidates"]}
    assert [table[x]["fits"] for x in ("none/none", "full/none", "none/update-on-host")] == [
        False,
        False,
        True,
    ]
    assert chosen["reason"] == (
        f"fastest of 2 fitting (1.0 ms/step, needs {need['full/update-on-host'] / 2**20:.1f} MiB); next "
        f"none/update-on-host (2.0 ms); over budget: none/none (needs {need['none/none'] / 2**20:.1f} MiB > "
        f"{budget / 2**20:.1f} MiB), full/none (needs {need['full/none'] / 2**20:.1f} MiB > {budget / 2**20:.1f} MiB)"
    )

    named = {k: v for k, v in VALUES.items() if k != "train.remat"}
    plain = train_recipe(
        quick(**named, **{"train.remat": "full", "train.placement": HOST}),
        tmp_path / "named",
        show_progress=False,
    )
    assert plain["placement"] == HOST
    assert len(losses(tmp_path / "auto")) == 3
    assert_bitwise_equal(np.array(losses(tmp_path / "auto")), np.array(losses(tmp_path / "named")))


def host_program(run, policy: str, batch: dict) -> tuple[dict, int, int]:
    """The update on the host's gradient program compiled from the arrays its step sends up
    (``up``: the compute-dtype params, the step and key): its :func:`step_bytes`; the bytes of
    the params it reads, the frozen leaves and the batch; and those with the step and key (the
    program leaves them out when it does not read them)."""
    engine = remat_search.with_candidate(run.engine, Candidate(policy, HOST))
    state, frozen = engine.init_state(run.params, 0, jax.random.key(0))
    step = engine.train_step
    up, batch = step.up(state), jax.device_put(engine.place_batch(batch))
    compiled = step.grads.lower(up, frozen, batch).compile()
    read = sum(x.nbytes for x in jax.tree.leaves((up.params, frozen, batch)))
    return step_bytes(compiled, True), read, read + up.step.nbytes + up.rng.nbytes


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_update_on_the_hosts_need_is_its_gradient_programs(precision):
    """Its need is the gradient program's analysis (the compute-dtype params, frozen leaves and
    batch in; the float32 gradient, loss and report out; temporaries), as compiled from the
    step's own arrays: the masters and the optimizer state are not device bytes. Where the
    arguments alone are over the budget, nothing is compiled."""
    run = build_run(quick(**VALUES, **{"train.precision": precision}), choose_remat=False)
    batch = train_batch(run, 0)
    among = candidates(["none", "full"], [HOST])
    rows = remat_search.search(run.engine, run.params, batch, None, among, host_separate=True)
    for row in rows:
        measured, read, resident = host_program(run, row["policy"], batch)
        assert row["need_bytes"] == footprint(measured), row
        assert row["argument_bytes"] == measured["argument_bytes"] == read, row
    over = remat_search.search(run.engine, run.params, batch, resident - 1, among, host_separate=True)
    assert [r.get("resident_bytes") for r in over] == [resident, resident] and not any(
        r["fits"] for r in over
    )
    at = remat_search.search(run.engine, run.params, batch, resident, among, host_separate=True)
    assert all("temp_bytes" in r and not r["fits"] for r in at)  # compiled: the temporaries do not fit


def test_nothing_fits_offers_the_host_only_where_it_was_not_a_candidate():
    """Where the update on the host was searched and did not fit either, the refusal does not
    offer it as the way out; where it was not (a CPU, a mesh), it does."""
    rows = marked([*ROWS, {**ROWS[1], "offload": HOST, "label": f"full/{HOST}"}], 399)
    searched = str(nothing_fits(rows, 399))
    assert "no policy fits the memory budget of 399 bytes" in searched and "--placement" not in searched
    assert "--placement update-on-host" in str(nothing_fits(marked(ROWS, 399), 399))
    unplaced = [{"policy": "none", "offload": HOST, "label": f"none/{HOST}", "resident_bytes": 9}]
    assert "--placement" not in str(nothing_fits(unplaced, 1))


@pytest.mark.usefixtures("few_policies")
def test_on_a_chip_a_budget_nothing_fits_is_refused_without_offering_the_host(tmp_path, monkeypatch):
    on_a_chip(monkeypatch, 1024)
    with pytest.raises(
        ZooError,
        match=r"no policy fits .* alone need [0-9,]+ bytes at the least\. Shrink the batch or model$",
    ):
        train_recipe(quick(**VALUES), tmp_path / "a", show_progress=False)
