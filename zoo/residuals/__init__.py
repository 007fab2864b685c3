"""Residual inspector: what a remat policy makes the backward pass keep, by name and byte.

Residuals are the values the forward pass hands to the backward pass. We find them the way
``jax.vjp`` does: trace ``vjp(f)`` to a jaxpr and read which forward values the pullback
closes over. Each residual is then followed back to where it was made, through
``reduce_precision`` (which ``checkpoint_name`` leaves behind), through ``device_put`` (how an
offloaded residual reaches ``pinned_host``), through ``jit`` calls, and into ``lax.scan``
bodies, so a value stacked over L layers is still reported under its activation name
(:mod:`zoo.names`) with ``count = L``.

Two views are reported:

``per_block``
    One scanned block on its own: the exact function the layer scan runs
    (:func:`zoo.scan.layer_body`), differentiated with respect to one layer's parameters and
    the block input. This is the quickest way to see what a policy does to a block.

``residuals``
    The whole model: ``vjp`` of the mean cross-entropy with respect to all parameters. Rows
    come in three scopes: ``stack`` (saved once per scan step: count L, or the outermost
    level's group inputs for ``nested`` and ``recursive``), ``outside`` (embedding, final
    LayerNorm, head and loss, and values that the scan hoists out of the loop because they do
    not depend on the layer, like the causal mask), and, for grouped stacks only, ``replay``:
    the block inputs that the backward pass rebuilds and holds while it works through one
    group of every inner level (L/G inputs for ``nested``; 2 per level for ``recursive`` at a
    power-of-two depth).

Residuals that are the parameters themselves (or a reshape/transpose of them) have
``kind = "param"``; batch inputs and labels have ``kind = "input"``. Both are listed but left
out of the totals: they live in memory for the whole step whatever the policy, and the scan
keeps the stacked parameters as they are rather than copying them per step. The totals are
the activation memory a policy controls.
"""

from zoo.residuals.find import DEVICE, HOST, Found, Origin, find_residuals
from zoo.residuals.report import batch_shapes, residual_report

__all__ = ["DEVICE", "HOST", "Found", "Origin", "batch_shapes", "find_residuals", "residual_report"]
