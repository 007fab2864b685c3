"""``--remat auto``: the fastest (policy, offload) pair whose compiled step fits the budget
(``--memory-budget``, or the device's memory), cached; the summary says what and why."""

import json

import jax
import jax.numpy as jnp
import pytest

from zoo import recipes
from zoo.commands import settings
from zoo.configs import OFFLOADS
from zoo.errors import ZooError
from zoo.remat import footprint, parse_bytes, step_bytes
from zoo.train import auto_remat, remat_search
from zoo.train.auto_remat import nothing_fits
from zoo.train.loop import train_recipe
from zoo.train.remat_search import HOST, Candidate, candidates, fits, pick
from zoo.train.run import build_run, train_batch


def test_parse_bytes():
    assert parse_bytes("256MiB") == 256 * 2**20
    assert parse_bytes("1.5GiB") == 3 * 2**29
    assert parse_bytes("300MB") == 300 * 10**6
    assert parse_bytes("4096") == parse_bytes(4096) == 4096
    for bad in ("lots", "12 parsecs", "0MiB", "-3MiB"):
        with pytest.raises(ZooError, match="memory budget"):
            parse_bytes(bad)


ROWS = [
    {"policy": "none", "offload": "none", "temp_bytes": 900, "argument_bytes": 100, "step_ms": 1.0},
    {"policy": "full", "offload": "none", "temp_bytes": 300, "argument_bytes": 100, "step_ms": 3.0},
    {"policy": "dots", "offload": "none", "temp_bytes": 500, "argument_bytes": 100, "step_ms": 2.0},
]
ROWS = [{**r, "label": f"{r['policy']}/none", "need_bytes": footprint(r)} for r in ROWS]


def marked(rows, budget):
    return [{**r, "fits": fits(r, budget)} for r in rows]


def test_the_fastest_fitting_policy_is_chosen():
    assert pick(marked(ROWS, 1000))["policy"] == "none"
    rows = marked(ROWS, 600)  # temp + arguments: none 1000 and dots 600
    assert pick(rows)["policy"] == "dots" and [r["fits"] for r in rows] == [False, True, True]
    assert pick(marked(ROWS, 399)) is None
    error = nothing_fits(marked(ROWS, 399), 399)
    assert "'full/none' at 400 bytes" in str(error) and "budget of 399 bytes" in str(error)
    assert footprint(ROWS[0]) == 1000
    tied = marked([ROWS[1], {**ROWS[2], "step_ms": 3.0}], 10**6)  # a tie: the earlier candidate
    assert pick(tied)["policy"] == "full" and pick(tied[::-1])["policy"] == "dots"


def test_step_bytes_counts_host_memory_only_where_it_is_the_devices():
    """A step with a 1 MiB argument in pinned_host and 256 KiB on the device (both donated): on
    an accelerator the host MiB is not a device byte, whether or not the analysis lumps it in
    (a CPU's does); on a CPU (one memory) every byte counts."""
    device = jax.devices()[0]
    host = jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")
    on_device = jax.sharding.SingleDeviceSharding(device, memory_kind="device")
    a = jax.device_put(jax.numpy.ones((1024, 256)), host)
    b = jax.device_put(jax.numpy.ones((256, 256)), on_device)

    def step(a, b):
        return jax.device_put(jax.device_put(a, on_device) * 2, host), b + 1

    compiled = jax.jit(step, donate_argnums=(0, 1)).lower(a, b).compile()
    apart, one = step_bytes(compiled, host_separate=True), step_bytes(compiled, host_separate=False)
    assert apart["host_bytes"] == one["host_bytes"] == a.nbytes
    assert apart["argument_bytes"] == b.nbytes and one["argument_bytes"] >= a.nbytes + b.nbytes
    assert footprint(one) - footprint(apart) == a.nbytes  # the host output aliases its argument

    class Reported:  # an analysis that reports host memory apart (as a chip may) is not cut twice
        def __init__(self, stats):
            self._stats = stats

        def __getattr__(self, name):
            return getattr(self._stats, name)

        @property
        def argument_size_in_bytes(self):
            return self._stats.argument_size_in_bytes - a.nbytes

        host_argument_size_in_bytes = property(lambda self: a.nbytes)

    class Compiled:
        def __getattr__(self, name):
            return getattr(compiled, name)

        def memory_analysis(self):
            return Reported(compiled.memory_analysis())

    assert step_bytes(Compiled(), host_separate=True)["argument_bytes"] == b.nbytes


def quick(**values):
    return settings.with_values(
        recipes.load_recipe("digits-mlp"),
        {
            "train.steps": 3,
            "train.eval_every": 3,
            "train.checkpoint_every": 3,
            "train.eval_batches": 1,
            **values,
        },
    )


# Three candidates, not all ten: the search is the same loop over any list (and the CLI's
# figures in docs/remat.md come from the full one).
CANDIDATES = ["none", "full", "nested"]


@pytest.fixture
def few_policies(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(auto_remat, "policy_names", lambda: CANDIDATES)


def test_auto_trains_with_the_choice_and_a_second_run_reads_the_cache(tmp_path, monkeypatch, few_policies):
    recipe = quick(**{"train.remat": "auto", "train.memory_budget": "1GiB"})
    summary = train_recipe(recipe, tmp_path / "a", show_progress=False)
    doc = json.loads((tmp_path / "cache" / auto_remat.CACHE_FILE).read_text())
    (entry,) = doc.values()
    fastest = min((r for r in entry["rows"] if r["fits"]), key=lambda r: r["step_ms"])
    assert summary["remat"] == f"auto:{entry['chosen']['policy']}" == f"auto:{fastest['policy']}"
    assert summary["remat_auto"]["budget_source"] == "flag" and summary["remat_auto"]["budget"] == 2**30
    assert summary["remat_auto"]["offload"] == summary["offload"] == "none"  # a CPU: the run's own
    assert summary["compile_count"] == 1  # the search compiles outside the training loop
    assert [r["policy"] for r in entry["rows"]] == CANDIDATES

    def no_search(*args, **kwargs):
        raise AssertionError("searched again despite the cache")

    monkeypatch.setattr(remat_search, "search", no_search)
    run = build_run(recipe)
    chosen, rows, cached = auto_remat.choose(run, train_batch(run, 0))
    assert cached and chosen == {**entry["chosen"], "budget_source": "flag"} and rows == entry["rows"]


def test_auto_refuses_a_budget_nothing_fits(tmp_path, few_policies):
    with pytest.raises(
        ZooError,
        match=r"no policy fits the memory budget of 1,024 bytes: the state and batch alone need [0-9,]+ "
        r"bytes at the least.*--placement update-on-host",
    ):
        train_recipe(
            quick(**{"train.remat": "auto", "train.memory_budget": "1KiB"}),
            tmp_path / "a",
            show_progress=False,
        )
    # A CPU reports no memory limit to take as the budget: the flag is required, in one line.
    with pytest.raises(ZooError, match=r"--remat auto needs a budget: the cpu device .*--memory-budget"):
        train_recipe(quick(**{"train.remat": "auto"}), tmp_path / "b", show_progress=False)


def test_an_unknown_remat_name_lists_auto_too():
    with pytest.raises(ZooError, match=r"unknown remat policy 'autox'.*; or auto \(with --memory-budget\)"):
        quick(**{"train.remat": "autox"})


def test_the_cache_key_holds_the_precision():
    """A bf16 run plans with bf16 steps: it does not read a float32 run's choice."""
    budget = {"train.remat": "auto", "train.memory_budget": "1GiB"}
    runs = {
        p: build_run(quick(**budget, **{"train.precision": p}), choose_remat=False)
        for p in ("float32", "bfloat16")
    }
    among = candidates(CANDIDATES, ["none"])
    keys = {p: auto_remat._key(run, train_batch(run, 0), 2**30, among) for p, run in runs.items()}
    assert keys["float32"] != keys["bfloat16"]
    run = runs["float32"]  # and the placements searched
    assert (
        auto_remat._key(run, train_batch(run, 0), 2**30, candidates(CANDIDATES, OFFLOADS)) != keys["float32"]
    )
    assert runs["bfloat16"].engine.precision.name == "bfloat16"


def device_argument_bytes(run, policy: str, offload: str, batch: dict) -> int:
    """The step's arguments in device memory, counted from the arrays themselves: the state and
    frozen leaves not in host memory (an offloaded state's are), and the batch."""
    engine = remat_search.with_candidate(run.engine, Candidate(policy, offload))
    state, frozen = engine.init_state(run.params, 0, jax.random.key(0))
    leaves = jax.tree.leaves((state, frozen))
    on_device = [x for x in leaves if x.sharding.memory_kind not in ("pinned_host", "unpinned_host")]
    return sum(x.nbytes for x in on_device) + sum(v.nbytes for v in batch.values())


def test_auto_picks_the_fastest_fitting_pair_from_a_table_it_measured(tmp_path, monkeypatch, few_policies):
    """On an accelerator (host memory apart from the device's) the search is over policies and
    placements (the update on the host among them: tests/train/test_auto_remat_host.py), and an
    offloaded state's bytes do not count against the budget. The budget here fits no pair that
    keeps its state on the device."""
    monkeypatch.setattr(auto_remat, "host_memory_is_separate", lambda: True)
    monkeypatch.setattr(auto_remat, "policy_names", lambda: ["none", "full"])
    run = build_run(quick(**{"train.remat": "auto", "train.memory_budget": "1GiB"}), choose_remat=False)
    batch = train_batch(run, 0)
    among = candidates(["none", "full"], OFFLOADS)
    untimed = remat_search.search(
        run.engine, run.params, batch, None, among, host_separate=True
    )  # bytes alone
    for row in untimed:  # the memory figures are the arrays': host bytes left out
        assert row["argument_bytes"] == device_argument_bytes(run, row["policy"], row["offload"], batch), row
    on_device = [r for r in untimed if r["offload"] == "none"]
    budget = min(footprint(r) for r in on_device) - 1

    recipe = quick(**{"train.remat": "auto", "train.memory_budget": budget})
    summary = train_recipe(recipe, tmp_path / "a", show_progress=False)
    (entry,) = json.loads((tmp_path / "cache" / auto_remat.CACHE_FILE).read_text()).values()
    table = entry["rows"]
    assert {(r["policy"], r["offload"]) for r in table} == {
        (p, o) for p in ("none", "full") for o in remat_search.PLACEMENTS
    }
    labels = {r["label"]: r for r in table}
    for row in table:  # fits: the device's bytes (temp, arguments, outputs not aliased) within budget
        if row.get("dominated_by"):  # the same policy fit and ran where less of the state moves
            first = labels[row["dominated_by"]]
            assert not row["fits"] and first["fits"] and first["policy"] == row["policy"], row
            assert first["offload"] in remat_search.NO_SLOWER_AT[row["offload"]]
            continue
        device_bytes = row["temp_bytes"] + row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"]
        assert row["fits"] == (device_bytes <= budget), row
    fitting = [r for r in table if r["fits"] and r["step_ms"] is not None and not r.get("same_as")]
    fastest = min(fitting, key=lambda r: r["step_ms"])
    assert fastest["offload"] != "none" and not any(r["fits"] for r in table if r["offload"] == "none")
    chosen = summary["remat_auto"]
    assert (chosen["policy"], chosen["offload"]) == (fastest["policy"], fastest["offload"])
    assert summary["placement"] == remat_search.placement_row(fastest["offload"]).name
    assert summary["remat"] == f"auto:{fastest['policy']}"
    assert chosen["budget"] == budget and chosen["budget_source"] == "flag"
    assert (
        chosen["reason"].startswith(f"fastest of {len(fitting)} fitting")
        and "over budget: " in chosen["reason"]
    )


class DeviceWithMemory:
    """The real first device, reporting ``stats`` as its memory (a CPU reports none)."""

    def __init__(self, stats):
        self._real, self._stats = jax.devices()[0], stats

    def __getattr__(self, name):
        return getattr(self._real, name)

    def memory_stats(self):
        return self._stats


def test_without_a_flag_the_budget_is_the_devices_memory(tmp_path, monkeypatch, few_policies):
    limit = 2**30
    monkeypatch.setattr(
        auto_remat, "_device", lambda: DeviceWithMemory({"bytes_limit": limit, "bytes_in_use": 7})
    )
    run = build_run(quick(**{"train.remat": "auto"}), choose_remat=False)
    budget, source = auto_remat.budget_of(run)
    assert source == "device" and 0 < auto_remat.SAFETY <= 0.1  # a small margin, below the limit
    assert budget == int(limit * (1 - auto_remat.SAFETY)) < limit
    summary = train_recipe(quick(**{"train.remat": "auto"}), tmp_path / "a", show_progress=False)
    assert summary["remat_auto"]["budget"] == budget and summary["remat_auto"]["budget_source"] == "device"
    flagged = build_run(quick(**{"train.remat": "auto", "train.memory_budget": "3MiB"}), choose_remat=False)
    assert auto_remat.budget_of(flagged) == (3 * 2**20, "flag")  # a flag wins over the device
    monkeypatch.setattr(auto_remat, "_device", lambda: DeviceWithMemory(None))
    with pytest.raises(ZooError, match=r"needs a budget.*add --memory-budget"):
        auto_remat.budget_of(run)


class Chip(DeviceWithMemory):
    """The real first device, saying it is a TPU with ``stats`` as its memory."""

    platform = "tpu"


def test_a_chips_budget_is_its_bytes_limit_else_its_hbm_never_its_peak(monkeypatch, few_policies):
    """On a TPU ``peak_bytes_in_use`` leaves out a program's temporaries: the budget is the
    allocator's ``bytes_limit``, else the chip's HBM capacity (``get_tpu_info``), less the margin."""
    run = build_run(quick(**{"train.remat": "auto"}), choose_remat=False)
    keep = 1 - auto_remat.SAFETY
    stats = {"bytes_limit": 16_909_336_064, "peak_bytes_in_use": 1_997_000_000, "bytes_in_use": 7}
    monkeypatch.setattr(auto_remat, "_device", lambda: Chip(stats))
    assert auto_remat.budget_of(run) == (int(16_909_336_064 * keep), "device")
    monkeypatch.setattr(auto_remat, "_tpu_hbm", lambda: 17_179_869_184)
    monkeypatch.setattr(auto_remat, "_device", lambda: Chip({"peak_bytes_in_use": 1_997_000_000}))
    assert auto_remat.budget_of(run) == (int(17_179_869_184 * keep), "device")
    assert auto_remat.device_memory(Chip({})) == (17_179_869_184, "tpu_info hbm_capacity_bytes")
    monkeypatch.setattr(auto_remat, "_tpu_hbm", lambda: None)  # an older JAX or an unknown chip
    with pytest.raises(ZooError, match=r"the tpu device reports no memory limit.*--memory-budget"):
        auto_remat.budget_of(run)
    monkeypatch.setattr(auto_remat, "_device", lambda: DeviceWithMemory({"peak_bytes_in_use": 10**9}))
    with pytest.raises(ZooError, match=r"the cpu device reports no memory limit"):  # a peak is no limit
        auto_remat.budget_of(run)


def test_on_a_chip_auto_picks_the_fastest_policy_and_placement_that_fit(tmp_path, monkeypatch, few_policies):
    """The chip path on a CPU: a device that says it is a TPU with ``bytes_limit`` of memory;
    every policy at every placement a candidate; each need from the step's own compiled memory
    analysis (a real CPU compile, the host-memory state left out); each time from a table
    (``time_candidates`` stubbed: its own test times real steps). The limit fits ``full`` but
    not ``none`` with the state on the device, and ``none`` with the optimizer state on the host."""
    monkeypatch.setattr(auto_remat, "policy_names", lambda: ["none", "full"])
    values = {"train.remat": "auto", "train.batch_size": 64, "model.num_layers": 2}
    run = build_run(quick(**values), choose_remat=False)
    everything = candidates(["none", "full"], (*OFFLOADS, HOST))
    probe = remat_search.search(
        run.engine, run.params, train_batch(run, 0), None, everything, host_separate=True
    )
    need = {r["label"]: r["need_bytes"] for r in probe}
    limit = int(need["full/none"] / (1 - auto_remat.SAFETY)) + 1
    budget = int(limit * (1 - auto_remat.SAFETY))
    assert need["none/optimizer"] <= need["full/none"] <= budget < need["none/none"], need
    assert need["none/update-on-host"] <= budget, need
    monkeypatch.setattr(auto_remat, "_device", lambda: Chip({"bytes_limit": limit, "peak_bytes_in_use": 1}))
    ms = {"none/none": 1, "none/optimizer": 2, "none/optimizer+params": 3, "full/none": 4}
    ms |= {
        "full/optimizer": 5,
        "full/optimizer+params": 6,
        "none/update-on-host": 3,
        "full/update-on-host": 7,
    }
    monkeypatch.setattr(
        remat_search, "time_candidates", lambda steps, *a: {c: [ms[c.label] / 1e3] * 3 for c in steps}
    )
    summary = train_recipe(quick(**values), tmp_path / "a", show_progress=False)
    chosen = summary["remat_auto"]
    assert (chosen["policy"], chosen["offload"]) == ("none", "optimizer")
    assert summary["remat"] == "auto:none" and summary["offload"] == "optimizer"
    assert summary["placement"] == "offload-optimizer"
    assert chosen["budget"] == budget and chosen["budget_source"] == "device"
    assert chosen["device_memory"] == {"bytes": limit, "from": "memory_stats bytes_limit", "kept_free": 0.05}
    table = {f"{r['policy']}/{r['offload']}": r for r in chosen["candidates"]}
    assert set(table) == {c.label for c in everything}  # the update on the host among them
    compiled = ("none/none", "full/none", "none/optimizer", "none/update-on-host")
    for label in compiled:  # the analysis's need
        assert table[label]["need_bytes"] == need[label]
    assert [table[x]["fits"] for x in compiled] == [False, True, True, True]
    assert [table[x]["step_ms"] for x in compiled] == [None, 4, 2, 3]
    assert table["none/optimizer+params"]["note"] == "dominated by none/optimizer"
    assert (
        table["full/optimizer"]["note"]
        == table["full/optimizer+params"]["note"]
        == table["full/update-on-host"]["note"]
        == "dominated by full/none"
    )
    assert chosen["reason"] == (
        f"fastest of 3 fitting (2.0 ms/step, needs {need['none/optimizer'] / 2**20:.1f} MiB); next "
        f"none/update-on-host (3.0 ms); over budget: none/none (needs {need['none/none'] / 2**20:.1f} MiB > "
        f"{budget / 2**20:.1f} MiB)"
    )


def test_a_pair_that_runs_out_of_memory_when_timed_does_not_fit():
    """memory_analysis() does not see everything the device holds: a fitting pair whose step
    runs out of memory is not timed, so not chosen (and a state it took is made again for the
    next); any other error is raised."""
    inits = []

    def init():
        inits.append(1)
        return jnp.zeros(3), {}

    def out_of_memory(state, frozen):
        state.delete()  # donated, then the run failed: the next step needs a new state
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")

    def fine(state, frozen):
        return state + 1, {}

    def broken(state, frozen):
        raise jax.errors.JaxRuntimeError("INTERNAL: something else")

    times = remat_search.time_candidates({"none": out_of_memory, "full": fine}, init, 2, None, None)
    assert times["none"] is None and len(times["full"]) == 2 and len(inits) == 2
    with pytest.raises(jax.errors.JaxRuntimeError, match="INTERNAL"):
        remat_search.time_candidates({"full": broken}, init, 2, None, None)
    rows = [
        {**ROWS[0], "step_ms": None, "out_of_memory": True, "need_bytes": 6},
        {**ROWS[1], "step_ms": 2.0, "need_bytes": 4},
    ]
    rows = marked(rows, 10)
    chosen = pick(rows)
    assert chosen["policy"] == "full" and [r["fits"] for r in rows] == [False, True]
    why = auto_remat.reason(chosen, rows, 10)
    assert why == (
        "fastest of 1 fitting (2.0 ms/step, needs 0.0 MiB); over budget: none/none (needs 0.0 MiB, out of "
        "memory when run)"
    )


def test_a_pair_the_compiler_refuses_for_memory_is_a_row_not_a_traceback(tmp_path, monkeypatch, few_policies):
    """A TPU refuses at compile time a program that cannot fit its memory: that pair is a row
    that does not fit, and the search goes on (it ended in a traceback)."""
    real = remat_search.with_candidate

    class Refused:
        def lower(self, *args):
            raise jax.errors.JaxRuntimeError(
                "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory"
            )

    class RefusedEngine:
        def __init__(self, engine):
            self._engine, self.train_step = engine, Refused()

        def __getattr__(self, name):
            return getattr(self._engine, name)

    def refuse_none(engine, candidate):
        out = real(engine, candidate)
        return RefusedEngine(out) if candidate.policy == "none" else out

    monkeypatch.setattr(remat_search, "with_candidate", refuse_none)
    run = build_run(quick(**{"train.remat": "auto", "train.memory_budget": "1GiB"}), choose_remat=False)
    among = candidates(CANDIDATES, ["none"])
    rows = remat_search.search(run.engine, run.params, train_batch(run, 0), 2**30, among, host_separate=False)
    by_policy = {r["policy"]: r for r in rows}
    assert by_policy["none"]["compile_oom"] and by_policy["none"].get("step_ms") is None
    assert not by_policy["none"]["fits"]
    assert by_policy["full"]["step_ms"] is not None and not by_policy["full"].get("out_of_memory")
    best = pick(rows)
    assert best["policy"] != "none"
    assert "none/none (does not compile: out of memory)" in auto_remat.reason(best, rows, 2**30)
    error = nothing_fits([by_policy["none"]], 2**30)
    assert "refused all 1 for memory" in str(error)


def test_the_cache_key_holds_the_microbatch_size():
    """Accumulation changes a step's footprint several-fold: a choice made at one microbatch
    size is not read at another."""
    values = {"train.remat": "auto", "train.memory_budget": "1GiB", "train.batch_size": 64}
    runs = [build_run(quick(**values, **{"train.microbatch_size": m}), choose_remat=False) for m in (None, 8)]
    keys = {
        auto_remat._key(run, train_batch(run, 0), 2**30, candidates(CANDIDATES, ["none"])) for run in runs
    }
    assert len(keys) == 2


def test_step_bytes_pairs_arguments_with_shardings_when_one_is_unused():
    """jit leaves an unused argument without a sharding: the arguments still pair (it raised)."""
    step = jax.jit(lambda s, unused, b: (s * 2, b + 1), donate_argnames="s")
    compiled = step.lower(jnp.ones(3), jnp.ones(4), jnp.ones(2)).compile()
    assert step_bytes(compiled, True)["host_bytes"] == 0
