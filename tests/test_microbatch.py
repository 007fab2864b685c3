"""zoo.microbatch: the one split order (microbatch i holds rows i, i + n, ...), its inverse, the
one "valid sizes" message, and the one accumulation loop (SUM outputs in float32, CONCAT outputs
in the batch's order), each check with the planted bug it catches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_bitwise_equal, assert_close
from zoo import microbatch
from zoo.losses import masked_mean

ROWS = 12


def test_microbatch_i_holds_rows_i_plus_multiples_of_n():
    rows = np.arange(ROWS)
    parts = np.asarray(microbatch.split(rows, 3))
    assert parts.tolist() == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8, 11]]
    check_every_device_gets_its_share(microbatch.split)


def check_every_device_gets_its_share(split, devices: int = 4, n: int = 3) -> None:
    """A batch sharded over ``devices`` in contiguous blocks: each microbatch takes the same
    number of rows from every device's block, so no device idles in any microbatch."""
    block = np.arange(ROWS) // (ROWS // devices)  # the device that holds each row
    for part in np.asarray(split(block, n)):
        assert np.bincount(part, minlength=devices).tolist() == [ROWS // n // devices] * devices, part


def contiguous(tree, n):
    """Planted: microbatch i holds the i-th contiguous block of rows."""
    return jax.tree.map(lambda a: jnp.asarray(a).reshape((n, a.shape[0] // n) + a.shape[1:]), tree)


def test_the_share_check_catches_contiguous_microbatches():
    with pytest.raises(AssertionError):
        check_every_device_gets_its_share(contiguous)


def test_merge_puts_every_row_back_in_its_place():
    tree = {"a": jnp.arange(ROWS * 2).reshape(ROWS, 2), "b": jnp.arange(ROWS) * 1.5}
    for n in microbatch.valid_sizes(ROWS):
        assert_bitwise_equal(microbatch.merge(microbatch.split(tree, n)), tree)


def test_the_valid_sizes_and_the_one_message():
    assert microbatch.valid_sizes(12) == [1, 2, 3, 4, 6, 12]
    assert microbatch.count(12, None) == 1 and microbatch.count(12, 4) == 3 and microbatch.count(None, 5) == 1
    for bad in (5, 0, -2, 2.0, True):
        with pytest.raises(ValueError) as error:
            microbatch.count(12, bad)
        message = str(error.value)
        assert message == (
            f"train.microbatch_size must be a positive int that divides the batch of 12 rows, got {bad!r}; "
            "valid microbatch sizes: 1, 2, 3, 4, 6, 12"
        )
    with pytest.raises(
        ValueError, match=r"^--microbatch must be a positive int that divides the batch, got 0$"
    ):
        microbatch.count(None, 0, "--microbatch")


# -- the accumulation ---------------------------------------------------------------------------
X = jnp.arange(ROWS * 4, dtype=jnp.float32).reshape(ROWS, 4) / 10
MASK = jnp.array([1.0, 0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1])
BATCH = {"x": X, "mask": MASK}
PARAMS = {"w": jnp.linspace(0.5, 1.5, 4)}
TOTAL = jnp.maximum(MASK.sum(), 1.0)


def losses(params, x):
    return jnp.sum((x * params["w"]) ** 2, axis=-1)


def loss_grad_and_per_row(part):
    """(loss, gradient) of the part's masked sum over the whole batch's count; the rows' losses."""

    def mean(params):
        per_row = losses(params, part["x"])
        return jnp.where(part["mask"] > 0, per_row * part["mask"], 0.0).sum() / TOTAL

    loss, grad = jax.value_and_grad(mean)(PARAMS)
    return loss, grad, losses(PARAMS, part["x"])


OUTPUTS = (microbatch.SUM, microbatch.SUM, microbatch.CONCAT)


def check_accumulation(accumulate=microbatch.accumulate) -> None:
    """Over every microbatch count, the summed loss and gradient are the whole batch's masked
    mean and its gradient (the float rule), and the per-row losses come back in order."""
    want_loss, want_grad = jax.value_and_grad(lambda p: masked_mean(losses(p, X), MASK))(PARAMS)
    for n in (1, 2, 3, 4, 6, 12):
        loss, grad, per_row = jax.jit(lambda b, n=n: accumulate(loss_grad_and_per_row, b, n, OUTPUTS))(BATCH)
        assert_close(loss, want_loss, n=ROWS * 4, what=f"loss, {n} microbatches")
        assert_close(grad, want_grad, n=ROWS * 4, what=f"gradient, {n} microbatches")
        assert_close(per_row, losses(PARAMS, X), n=4, what=f"per-row losses, {n} microbatches")


@pytest.mark.numerics
def test_the_accumulated_outputs_are_the_whole_batchs():
    check_accumulation()


def keeps_the_last(fn, batch, n, outputs):
    """Planted: the running total is overwritten by each microbatch, not added to."""
    real_scan = jax.lax.scan

    def scan(body, init, xs):
        def overwrite(carry, x):
            new, ys = body(carry, x)
            return body(jax.tree.map(jnp.zeros_like, carry), x)[0], ys

        return real_scan(overwrite, init, xs)

    jax.lax.scan = scan
    try:
        return microbatch.accumulate(fn, batch, n, outputs)
    finally:
        jax.lax.scan = real_scan


def drops_one(fn, batch, n, outputs):
    """Planted: the last microbatch is never run (its rows come back as the first's)."""
    if n == 1:
        return microbatch.accumulate(fn, batch, n, outputs)
    real_split = microbatch.split
    microbatch.split = lambda t, k: jax.tree.map(lambda a: a.at[-1].set(a[0]), real_split(t, k))
    try:
        return microbatch.accumulate(fn, batch, n, outputs)
    finally:
        microbatch.split = real_split


def wrong_order(fn, batch, n, outputs):
    """Planted: the microbatches are split contiguously but merged as rows i::n."""
    real_split = microbatch.split
    microbatch.split = contiguous
    try:
        return microbatch.accumulate(fn, batch, n, outputs)
    finally:
        microbatch.split = real_split


@pytest.mark.parametrize("plant", [keeps_the_last, drops_one, wrong_order])
def test_the_accumulation_check_catches_planted_bugs(plant):
    with pytest.raises(AssertionError):
        check_accumulation(plant)


def test_n_one_calls_fn_once_on_the_whole_batch():
    calls = []

    def fn(part):
        calls.append(part["x"].shape)
        return (part["x"].sum(),)

    (total,) = microbatch.accumulate(fn, BATCH, 1, (microbatch.SUM,))
    assert calls == [(ROWS, 4)] and float(total) == float(X.sum())


def test_sums_run_in_float32_and_come_back_in_their_dtype():
    """A bfloat16 output is added up in float32 (the carry of the scan) and cast back once: the
    sum of 12 rows of 1 + 2^-8 keeps what a bf16 running total would round away."""
    x = jnp.full((ROWS, 1), 1 + 2.0**-7, jnp.bfloat16)
    (total,) = microbatch.accumulate(lambda p: (p.sum(axis=0),), x, ROWS, (microbatch.SUM,))
    jaxpr = jax.make_jaxpr(
        lambda a: microbatch.accumulate(lambda p: (p.sum(axis=0),), a, ROWS, (microbatch.SUM,))
    )(x)
    scan = next(e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan")
    assert [str(v.aval.dtype) for v in scan.outvars] == ["float32"]
    assert total.dtype == jnp.bfloat16 and float(total[0]) == float(jnp.bfloat16(12 * (1 + 2.0**-7)))


def test_an_unknown_accumulation_is_refused():
    with pytest.raises(ValueError, match="unknown accumulation 'mean'; valid: sum, concat"):
        microbatch.accumulate(lambda p: (p,), X, 2, ("mean",))
