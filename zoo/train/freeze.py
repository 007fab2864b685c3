"""Moved to :mod:`zoo.freeze` (ghost clipping in ``zoo.dp`` needs it and must not import
``zoo.train``)."""

from zoo.freeze import STACK, FreezePlan, Pattern, parse_pattern, resolve_freeze

__all__ = ["STACK", "FreezePlan", "Pattern", "parse_pattern", "resolve_freeze"]
