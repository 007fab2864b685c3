"""zoo.parallel.host_up: the params' trip up in pieces. Each leaf arrives on the device as its
cast to the compute dtype, bit for bit; no single copy moves more than the leaf's share of
``chunk_bytes``; the cast bytes on their way keep to the trip's budget; and both host steps
send their params up this way (``zoo train``'s serial step too: one copy of the whole tree
ran at 0.5 GB/s on a TPU v5e)."""

from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_bitwise_equal
from tests.parallel.test_host_pipeline import engine_for
from zoo.parallel import host_up
from zoo.parallel.host_budget import ByteBudget
from zoo.parallel.host_step import HostStep, SerialHostStep
from zoo.parallel.host_up import Uplink
from zoo.precision import Precision

SHAPES = [(16, 4), (10, 4), (3,), (), (40, 2, 3)]
CHUNK = 64  # float32 bytes: every leaf of 2+ rows is cut


def leaves_of(seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in SHAPES]


@pytest.fixture
def sent(monkeypatch):
    """The bytes of every piece a trip hands to ``jax.device_put``."""
    sizes = []
    put = jax.device_put

    def recorded(x, *args, **kwargs):
        sizes.extend(a.size * a.dtype.itemsize for a in jax.tree.leaves(x))
        return put(x, *args, **kwargs)

    monkeypatch.setattr(host_up.jax, "device_put", recorded)
    return sizes


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_each_leaf_arrives_as_its_cast_in_pieces(precision, sent):
    policy = Precision(precision)
    with ThreadPoolExecutor(4) as pool:
        uplink = Uplink(policy, jax.devices()[0], pool, chunk_bytes=CHUNK)
        leaves = leaves_of()
        up = uplink.all(leaves)
    for got, leaf in zip(up, leaves, strict=True):
        assert_bitwise_equal(got, policy.to_compute({"leaf": leaf})["leaf"])
    itemsize = jnp.dtype(policy.compute_dtype).itemsize
    # the rows are shared out evenly, so a piece is at most CHUNK float32 bytes and one row
    # more (the widest row here: 2 x 3 values), in the compute dtype
    assert sent and max(sent) <= (CHUNK + 2 * 3 * 4) * itemsize // 4, sent
    assert len(sent) > len(SHAPES)  # the leaves of several rows went up in several pieces


def test_the_cast_bytes_on_their_way_keep_to_the_budget():
    policy = Precision("bfloat16")
    with ThreadPoolExecutor(8) as pool:
        uplink = Uplink(policy, jax.devices()[0], pool, chunk_bytes=CHUNK)
        budget = ByteBudget(40 * 2 * 3 * 2)  # the largest leaf's cast bytes
        uplink.all(leaves_of(), budget=budget)
        assert 0 < budget.peak <= budget.limit
        assert uplink.budget(leaves_of()).limit == 2 * 40 * 2 * 3 * 2  # twice the largest leaf's


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_whole_tree_goes_up_with_one_cast_and_one_join(precision, sent):
    """The whole-tree step's trip (``Uplink.tree``): the same values, the same pieces, and one
    compile of each program whatever the leaves' shapes; with nothing to cast or cut, none."""
    policy = Precision(precision)
    with ThreadPoolExecutor(4) as pool:
        uplink = Uplink(policy, jax.devices()[0], pool, chunk_bytes=CHUNK)
        leaves = leaves_of()
        up = uplink.tree(leaves)
        pieces = list(sent)
        uplink.tree(leaves_of(1))
        whole = Uplink(policy, jax.devices()[0], pool)  # 64 MiB pieces: nothing here is cut
        whole.tree(leaves)
    for got, leaf in zip(up, leaves, strict=True):
        assert_bitwise_equal(got, policy.to_compute({"leaf": leaf})["leaf"])
    itemsize = jnp.dtype(policy.compute_dtype).itemsize
    assert max(pieces) <= (CHUNK + 2 * 3 * 4) * itemsize // 4 and len(pieces) > 3 * len(SHAPES), pieces
    assert uplink.cast_split_all._cache_size() == 1
    assert uplink.cast_split._cache_size() == 0  # the leaf-by-leaf program never ran
    assert whole.cast_split_all._cache_size() == (0 if precision == "float32" else 1)


@pytest.mark.parametrize("step_class, trip", [(SerialHostStep, "tree"), (HostStep, "all")])
def test_both_host_steps_send_the_params_up_in_pieces(step_class, trip, monkeypatch):
    engine, params = engine_for("bfloat16", "adamw")
    step = step_class(engine)
    calls = []
    real = getattr(Uplink, trip)
    monkeypatch.setattr(
        Uplink, trip, lambda self, leaves, *a: calls.append(len(leaves)) or real(self, leaves, *a)
    )
    state, _ = engine.init_state(params, 0, jax.random.key(3))
    up = step.params_up(state.params)
    assert calls == [len(jax.tree.leaves(state.params))]
    assert_bitwise_equal(up, engine.precision.to_compute(state.params))
