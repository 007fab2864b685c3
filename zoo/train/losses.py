"""Moved to :mod:`zoo.losses` (``zoo.dp`` needs the losses and must not import ``zoo.train``)."""

from zoo.losses import accuracy_per_example, masked_mean, per_example_loss

__all__ = ["accuracy_per_example", "masked_mean", "per_example_loss"]
