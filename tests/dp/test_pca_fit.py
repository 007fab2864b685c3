"""zoo.dp.pca_fit: DP-PCA's mechanism against a float64 NumPy reference, its noise, its sensitivity,
and its keys; each check has a planted bug it catches."""

import jax
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.dp import pca_fit as pca
from zoo.dp.noise import noise_key
from zoo.train.state import BATCH_STREAM

RNG = np.random.default_rng(0)
X = (RNG.random((300, 12)) * np.linspace(0.2, 3.0, 12)).astype(np.float32)  # rows of norm > 1


def reference_second_moment(x, bound=1.0):
    """The same statistic, written the obvious way in float64, one row at a time."""
    total = np.zeros((x.shape[1], x.shape[1]))
    for row in np.asarray(x, np.float64):
        if np.isfinite(row).all():
            row = row * min(1.0, bound / np.linalg.norm(row)) if np.linalg.norm(row) else row
            total += np.outer(row, row)
    return total


@pytest.mark.numerics
def test_second_moment_of_clipped_rows_equals_a_float64_loop():
    x = X.copy()
    x[5] = np.nan  # a row that is not finite contributes nothing
    assert_close(pca.second_moment(x, 1.0), reference_second_moment(x), n=len(x), what="second moment")
    assert_close(pca.second_moment(x, 0.5), reference_second_moment(x, 0.5), n=len(x), what="bound 0.5")


def test_the_second_moment_check_still_catches_unclipped_rows(monkeypatch):
    monkeypatch.setattr(pca, "clip_rows", lambda x, bound=1.0: np.nan_to_num(np.asarray(x, np.float64)))
    with pytest.raises(AssertionError):
        test_second_moment_of_clipped_rows_equals_a_float64_loop()


def principal_subspace(x, k):
    """The projector onto the top-k eigenvectors of the reference second moment."""
    values, vectors = np.linalg.eigh(reference_second_moment(x))
    top = vectors[:, np.argsort(values)[::-1][:k]]
    return top @ top.T


@pytest.mark.numerics
def test_without_noise_the_projection_spans_the_principal_subspace():
    got = pca.private_pca(X, 4, noise_multiplier=0.0, key=None).astype(np.float64)
    assert got.shape == (12, 4) and got.dtype == np.float64
    assert_close(got.T @ got, np.eye(4), n=12, dtype=np.float32, what="orthonormal columns")
    assert_close(got @ got.T, principal_subspace(X, 4), n=12, dtype=np.float32, what="the subspace")
    assert (np.abs(got).argmax(axis=0) == np.abs(got).argmax(axis=0)).all()
    biggest = got[np.abs(got).argmax(axis=0), np.arange(4)]
    assert (biggest > 0).all()  # each column's sign is fixed


def test_the_subspace_check_still_catches_the_smallest_directions(monkeypatch):
    def bottom(matrix, k):
        values, vectors = np.linalg.eigh(matrix)
        return vectors[:, :k].astype(np.float32)

    monkeypatch.setattr(pca, "top_directions", bottom)
    with pytest.raises(AssertionError):
        test_without_noise_the_projection_spans_the_principal_subspace()


def check_noise(draw) -> None:
    """``draw(key)`` is a [d, d] noise matrix of std 2: symmetric, each upper entry N(0, 4),
    independent of the others and of another key's."""
    z = np.stack([draw(jax.random.key(i)) for i in range(40)])
    assert (z == np.swapaxes(z, 1, 2)).all(), "not symmetric"
    upper = z[:, *np.triu_indices(z.shape[1])]
    assert abs(upper.std() - 2.0) < 0.05, upper.std()  # 40 x 528 draws: std's error ~0.01
    assert abs(upper.mean()) < 0.05, upper.mean()
    corr = np.corrcoef(upper[:, :50].T)[np.triu_indices(50, 1)]
    assert np.abs(corr).max() < 0.7 and abs(corr.mean()) < 0.02, "entries are correlated"


def test_the_noise_is_symmetric_with_iid_upper_entries_of_the_asked_std():
    check_noise(lambda key: pca.symmetric_noise(key, 32, 2.0, None))


def test_the_noise_check_still_catches_a_wrong_scale_and_a_doubled_diagonal():
    with pytest.raises(AssertionError):  # planted: the std without its factor
        check_noise(lambda key: pca.symmetric_noise(key, 32, 1.0, None))
    with pytest.raises(AssertionError):  # planted: Z + Z^T (diagonal std 2 sqrt 2, off-diagonal sqrt 2)
        check_noise(lambda key: (lambda g: g + g.T)(2.0 * np.asarray(jax.random.normal(key, (32, 32)))))


def check_sensitivity(second_moment) -> None:
    """Adding one row, however large, moves the upper triangle of the statistic by at most
    bound^2 in L2 norm: the sensitivity the Gaussian noise is calibrated for."""
    for bound in (1.0, 0.3):
        base = second_moment(X, bound)
        for row in (X[0] * 1e6, np.full(12, 1e-3, np.float32), -X[1]):
            more = second_moment(np.vstack([X, row[None]]), bound)
            change = (more - base)[np.triu_indices(12)]
            assert np.linalg.norm(change) <= bound**2 * (1 + 1e-6), (bound, np.linalg.norm(change))


def test_one_row_moves_the_release_by_at_most_the_bound_squared():
    check_sensitivity(pca.second_moment)


def test_the_sensitivity_check_still_catches_a_bound_applied_to_each_entry():
    clip_entries = lambda x, bound=1.0: np.clip(np.nan_to_num(np.asarray(x, np.float64)), -bound, bound)  # noqa: E731
    with pytest.MonkeyPatch.context() as m:
        m.setattr(pca, "clip_rows", clip_entries)
        with pytest.raises(AssertionError):
            check_sensitivity(pca.second_moment)


def test_the_key_fixes_the_noise_and_is_a_stream_of_its_own():
    root = jax.random.key(3)
    key = jax.random.fold_in(root, pca.PCA_STREAM)
    a = pca.private_pca(X, 3, noise_multiplier=5.0, key=key)
    assert (a == pca.private_pca(X, 3, noise_multiplier=5.0, key=key)).all()
    assert not (a == pca.private_pca(X, 3, noise_multiplier=5.0, key=jax.random.key(4))).all()
    assert not np.allclose(a, pca.private_pca(X, 3, noise_multiplier=0.0, key=None))
    # the step keys are fold_in(root, step) with step < 2**31; the batches' stream is another
    assert pca.PCA_STREAM >= 2**31 and pca.PCA_STREAM != BATCH_STREAM
    assert str(jax.random.key_impl(noise_key(key, "philox4x32"))) == "philox4x32"
    with pytest.raises(ValueError, match="key"):
        pca.noisy_second_moment(X, 1.0, None)
    with pytest.raises(ValueError, match="k must be"):
        pca.private_pca(X, 13, noise_multiplier=0.0, key=None)


@pytest.mark.parametrize(
    ("pca_epsilon", "fix"),
    [(1e-6, "raise dp.pca_epsilon to at least"), (200.0, "set dp.pca_epsilon below")],
)
def test_a_pca_budget_out_of_range_names_dp_pca_epsilon_and_its_one_release(pca_epsilon, fix):
    """The projection's noise is calibrated for one Gaussian release: an unreachable share is
    refused naming the setting at fault, not DP-SGD's steps ("over 1 steps ... fewer steps")."""
    from zoo.configs import DPConfig
    from zoo.dp.mechanisms import mechanism_for
    from zoo.errors import ZooError

    cfg = DPConfig(enabled=True, epsilon=400.0, pca_epsilon=pca_epsilon)
    with pytest.raises(ZooError) as caught:
        mechanism_for(cfg, 1000)  # the DP-PCA row calibrates the release
    message = str(caught.value)
    assert f"dp.pca_epsilon={pca_epsilon:g}" in message and "one Gaussian release" in message
    assert fix in message and "steps" not in message.replace("DP-SGD's steps", "")
