"""Per Hugging Face fixture and backend: max |dlogits| / max |logits| against the logits
``transformers`` computed (``tests/fixtures/hf``), and the mean KL(transformers || zoo) per
token, in float64 from the float32 logits.

    .venv/bin/python benchmarks/hf/parity.py
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file
from scipy.special import log_softmax

import zoo
from zoo.models import hf_io

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf"


def main() -> None:
    print(f"{'fixture':<14} {'backend':<7} {'B x T':<8} {'max|dlogits|/max|logits|':>24} {'KL':>10}")
    for src in sorted(p for p in FIXTURES.iterdir() if (p / "config.json").exists()):
        cfg, params = hf_io.load(src)
        ref = load_file(str(src / "reference.safetensors"))
        expected = ref["logits"].astype(np.float64)
        for backend in zoo.BACKENDS:
            got = np.asarray(jax.jit(zoo.apply_fn(cfg, backend))(params, jnp.asarray(ref["ids"])), np.float64)
            rel = np.abs(got - expected).max() / np.abs(expected).max()
            logq, logp = log_softmax(expected, -1), log_softmax(got, -1)
            kl = np.mean(np.sum(np.exp(logq) * (logq - logp), -1))
            shape = "x".join(map(str, ref["ids"].shape))
            print(f"{src.name:<14} {backend:<7} {shape:<8} {rel:>24.2e} {kl:>10.1e}")


if __name__ == "__main__":
    main()
