"""The eval examples a trained model finds hardest: the K with the highest loss.

The error analysis of the JAX practice chapter's capstone: on the spiral, the hardest points
all sit at the origin, where the three arms meet.
"""

from __future__ import annotations

import heapq

import jax
import numpy as np

from zoo.losses import accuracy_per_example, per_example_loss


def example_stats(engine, trainable, frozen, x, y):
    """Per-example ``(loss, predicted class, probability of the label)`` of a batch; for a
    language model the prediction columns are per-token means and left out."""
    logits = engine.logits(engine.freeze.merge(trainable, frozen), x)
    losses = per_example_loss(logits, y)
    probs = jax.nn.softmax(logits.astype(np.float32), axis=-1)
    if logits.ndim == 2:  # classifier
        p_label = jax.numpy.take_along_axis(probs, y[:, None], axis=-1)[:, 0]
        return losses, logits.argmax(-1), p_label
    return losses, None, accuracy_per_example(logits, y)


def hardest(engine, state, frozen, batches, k: int) -> list[dict]:
    """The ``k`` eval examples with the highest loss, hardest first: their position in the eval
    split, loss, label and prediction (classifiers), and the input when it has at most 8
    features."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"--hardest must be a positive number of examples, got {k!r}")
    stats = jax.jit(lambda t, f, x, y: example_stats(engine, t, f, x, y))
    params = engine.eval_params(state.params)  # beside the frozen leaves (update-on-host: a device copy)
    heap: list[tuple[float, int, dict]] = []
    index = 0
    for batch in batches:
        losses, pred, third = (
            None if a is None else np.asarray(a) for a in stats(params, frozen, batch["x"], batch["y"])
        )
        for i in np.flatnonzero(np.asarray(batch["mask"]) > 0):
            row = {"index": index, "loss": float(losses[i])}
            if pred is not None:
                row.update(label=int(batch["y"][i]), predicted=int(pred[i]), p_label=float(third[i]))
                x = np.asarray(batch["x"][i]).ravel()
                if x.size <= 8:
                    row["x"] = [round(float(v), 4) for v in x]
            else:
                row["token_accuracy"] = float(third[i])
            index += 1
            # A NaN loss ranks as the hardest (+inf); the row keeps the real value.
            rank = float("inf") if np.isnan(row["loss"]) else row["loss"]
            item = (rank, -row["index"], row)
            if len(heap) < k:
                heapq.heappush(heap, item)
            else:
                heapq.heappushpop(heap, item)
    return [row for _, _, row in sorted(heap, key=lambda t: (-t[0], -t[1]))]  # hardest, then lowest index
