"""``zoo.train.remat_search``: the one chooser behind ``--remat auto`` and ``zoo bench remat
--budget``: its candidates (policy x placement), what it skips, how it times, and its rule."""

import jax.numpy as jnp
import pytest

from zoo import recipes
from zoo.commands import settings
from zoo.configs import OFFLOADS
from zoo.parallel.placement import PLACEMENTS as placement_table
from zoo.train import remat_search
from zoo.train.remat_search import (
    HOST,
    IN_PROGRAM,
    PLACEMENTS,
    Candidate,
    candidates,
    pick,
    placement_of,
    placement_row,
    search,
    with_candidate,
)
from zoo.train.run import build_run, train_batch


@pytest.fixture(scope="module")
def run():
    recipe = settings.with_values(
        recipes.load_recipe("digits-mlp"), {"train.steps": 3, "train.batch_size": 64, "model.num_layers": 2}
    )
    return build_run(recipe, choose_remat=False)


def test_the_placement_axis_is_every_placement(run):
    """The search's placements are the rows of zoo.parallel.placement.PLACEMENTS, in the order
    that moves more of the state, the in-program ones by their old offload names: the engine a
    candidate makes is at that placement (its host fields those of the row), and the engine's
    own placement is found in it."""
    assert PLACEMENTS == (*OFFLOADS, HOST) and IN_PROGRAM == OFFLOADS
    for name, row in zip(PLACEMENTS, placement_table.values(), strict=True):
        engine = with_candidate(run.engine, Candidate("full", name))
        assert engine.placement is row and engine.stack.policy.name == "full" and placement_of(engine) == name
    assert row.update_on_host and placement_row(HOST) is row
    assert [c.label for c in candidates(["none", "full"], ["none", "optimizer"])] == [
        "none/none",
        "full/none",
        "none/optimizer",
        "full/optimizer",
    ]


class Clock:
    """A clock the fake steps advance by their cost; it records who stepped, in order."""

    def __init__(self):
        self.now, self.calls = 0.0, []

    def __call__(self):
        return self.now

    def step(self, name: str, cost: float):
        def run(state, frozen):
            self.now += cost
            self.calls.append(name)
            return state + 1, {"loss": state}

        return run


def test_candidates_take_turns_on_one_state_and_a_slow_one_stops_after_a_round(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(remat_search, "clock", clock)
    inits = []

    def init():
        inits.append(1)
        return jnp.zeros(()), {}

    steps = {"a": clock.step("a", 1.0), "b": clock.step("b", 1.25), "slow": clock.step("slow", 2.0)}
    times = remat_search.time_candidates(steps, init, rounds=3, stop_slower=1.5, best=None)
    assert times == {"a": [1.0] * 3, "b": [1.25] * 3, "slow": [2.0]}
    assert len(inits) == 1  # one state, passed from step to step
    # a warm-up step each, then per round an untimed and a timed step each, in turn
    assert clock.calls == ["a", "b", "slow"] + ["a", "a", "b", "b", "slow", "slow"] + ["a", "a", "b", "b"] * 2
    # the fastest of an earlier placement counts too: here it stops both
    clock.calls.clear()
    times = remat_search.time_candidates(steps, init, rounds=3, stop_slower=1.5, best=0.5)
    assert times == {"a": [1.0], "b": [1.25], "slow": [2.0]}
    # a step of seconds is timed once: one reading is a fraction of a percent of it
    monkeypatch.setattr(remat_search, "LONG_STEP", 1.1)
    times = remat_search.time_candidates(steps, init, rounds=3, stop_slower=1.5, best=None)
    assert times == {"a": [1.0] * 3, "b": [1.25], "slow": [2.0]}
    # without a cut (the bench), every one runs every round
    times = remat_search.time_candidates(steps, init, rounds=2, stop_slower=None, best=0.5)
    assert all(len(t) == 2 for t in times.values())


def test_a_placement_whose_arguments_alone_are_over_the_budget_is_not_compiled(run, monkeypatch):
    """The state, frozen leaves and batch are live for the whole step: where they alone are over
    the budget no policy can fit, and nothing is compiled. Their count is the compiled step's
    own argument bytes."""
    batch = train_batch(run, 0)
    (compiled,) = search(
        run.engine, run.params, batch, None, candidates(["full"], ["none"]), host_separate=True
    )
    budget = compiled["argument_bytes"] - 1

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled a step whose arguments alone are over the budget")

    monkeypatch.setattr(remat_search, "_compile", no_compile)
    rows = search(
        run.engine, run.params, batch, budget, candidates(["none", "full"], ["none"]), host_separate=True
    )
    assert [r["resident_bytes"] for r in rows] == [compiled["argument_bytes"]] * 2
    assert [r["need_bytes"] for r in rows] == [compiled["argument_bytes"]] * 2
    assert not any(r["fits"] for r in rows) and pick(rows) is None


def test_a_policy_that_fit_is_not_tried_where_more_of_the_state_moves(run, monkeypatch):
    """Dominance: full fit at placement none, so full/optimizer (the same step plus copies) is
    skipped; none did not fit at none, so none/optimizer is compiled and timed."""
    batch = train_batch(run, 0)
    both = candidates(["none", "full"], ["none", "optimizer"])
    untimed = {r["label"]: r for r in search(run.engine, run.params, batch, None, both, host_separate=True)}
    budget = untimed["full/none"]["need_bytes"]
    assert untimed["none/none"]["need_bytes"] > budget, "the test needs none to need more than full"
    rows = {r["label"]: r for r in search(run.engine, run.params, batch, budget, both, host_separate=True)}
    assert rows["full/optimizer"]["dominated_by"] == "full/none" and rows["full/none"]["step_ms"] is not None
    assert "dominated_by" not in rows["none/optimizer"] and "temp_bytes" in rows["none/optimizer"]
    assert not rows["full/optimizer"]["fits"]


def test_the_update_on_the_host_is_dominated_by_the_device_step_alone(run):
    """The same policy with the state on the device fit and ran: the update on the host (its
    gradient plus trips and the host's update) is skipped. Fitting only with an offload does not
    skip it: it moves less than an offload of the params, so it may be faster."""
    batch = train_batch(run, 0)
    among = candidates(["none", "full"], ["none", "optimizer", HOST])
    untimed = {r["label"]: r for r in search(run.engine, run.params, batch, None, among, host_separate=True)}
    budget = max(untimed[x]["need_bytes"] for x in ("full/none", "none/optimizer", "none/update-on-host"))
    assert untimed["none/none"]["need_bytes"] > budget, "the test needs none to fit only off the device"
    rows = {r["label"]: r for r in search(run.engine, run.params, batch, budget, among, host_separate=True)}
    assert (
        rows["full/update-on-host"]["dominated_by"] == "full/none" and not rows["full/update-on-host"]["fits"]
    )
    assert rows["none/optimizer"]["fits"] and rows["none/optimizer"]["step_ms"] is not None
    assert "dominated_by" not in rows["none/update-on-host"] and rows["none/update-on-host"]["fits"]
    assert rows["none/update-on-host"]["step_ms"] is not None
