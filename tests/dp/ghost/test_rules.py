"""The per-op norm rules (``zoo.dp.ghost.rules``).

Ghost clipping of a leaf shared by two ops: the token table read by the embedding gather and
by a head tied to it (GPT-2, Llama 3.2). The per-example norm is ``|g_embed + g_head|^2`` with
its cross term (``zoo.dp.ghost.rules.tied_cross``); it must equal the vmap path's on the real
tied models, and the coverage check must still refuse any other double claim. And the choice
of a dense op's norm form."""

import warnings

import numpy as np
import pytest

import zoo
from tests.dp.ghost.test_api import B, compare
from zoo.dp.ghost import rules
from zoo.dp.ghost.sites import Site, coverage_problem

pytestmark = pytest.mark.numerics

TIED = {  # a GPT-2-like transformer (attention biases, tied head) and a tied Llama
    "gpt2-like": zoo.get_config(
        "transformer-xs", d_model=32, d_ff=64, max_len=16, vocab_size=40, attn_bias=True, tie_head=True
    ),
    "llama-tied": zoo.get_config("llama-xs", d_model=32, d_ff=64, max_len=16, vocab_size=40, tie_head=True),
}


@pytest.mark.parametrize(
    "name, dense", [("gpt2-like", "gram"), ("gpt2-like", "materialise"), ("llama-tied", "gram")]
)
def test_tied_head_matches_vmap_path(name, dense):
    mask = np.ones(B, np.float32)
    mask[2] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the vmap path
        compare(TIED[name], dense=dense, mask=mask)


class NoCross(rules.Tied):
    """Planted: the two ops' norms added as if they read separate leaves."""

    @staticmethod
    def join(first, second):
        return 0.0 * rules.Tied.join(first, second)


@pytest.mark.parametrize("method", ["bookkeeping", "backward"])
def test_the_cross_term_is_what_makes_it_exact(monkeypatch, method):
    """Without the cross term (the norms of the two ops added, as if separate leaves) the float
    rule catches the difference, by either method."""
    cfg = zoo.get_config("llama-xs", d_model=32, d_ff=64, max_len=16, vocab_size=41, tie_head=True)
    monkeypatch.setitem(rules.SHARED, ("gather", "unembed"), NoCross)
    with pytest.raises(AssertionError, match="norms"):
        compare(cfg, method=method)


@pytest.mark.parametrize("dense", ["gram", "materialise"])
def test_the_second_backward_clips_a_tied_head_too(dense):
    """The head's tap and the table's each take their half of the cross term in the backward
    pass, so the second backward needs no book-keeping (and no vmap fallback) for a tied head."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare(TIED["gpt2-like"], method="backward", dense=dense)


def _site(path, kind, stacked=False):
    return Site(path, kind, ("w",), stacked, (2, 4, 8), 8)


@pytest.mark.parametrize(
    "sites, refused",
    [
        ((_site("embed", "gather"), _site("embed", "unembed")), False),
        ((_site("embed", "unembed"), _site("embed", "gather")), True),  # not the tied order
        ((_site("embed", "gather"), _site("embed", "gather")), True),
        ((_site("head", "dense"), _site("head", "dense")), True),
        ((_site("blocks.e", "gather", True), _site("blocks.e", "unembed", True)), True),
        ((_site("embed", "gather"), _site("embed", "unembed"), _site("embed", "dense")), True),
    ],
)
def test_coverage_allows_only_the_tied_pair(sites, refused):
    paths = {f"{s.path}.w" for s in sites}
    problem = coverage_problem(sites, (), paths)
    assert (problem is not None) == refused, problem


@pytest.mark.parametrize(
    "seq, d_in, d_out, form",
    [
        (4, 64, 2, "gram"),  # a user of 4 single-row records: fewer flops materialised, too few positions
        (16, 32, 32, "gram"),  # the same at 16
        (32, 32, 32, "materialise"),  # fewer flops, enough positions
        (64, 64, 256, "materialise"),
        (64, 256, 256, "gram"),  # more flops materialised
    ],
)
def test_dense_method_materialises_only_with_fewer_flops_and_enough_positions(seq, d_in, d_out, form):
    assert rules.dense_method(seq, d_in, d_out) == form
