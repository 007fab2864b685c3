"""Empirical privacy audits: a lower bound on epsilon from one training run with canaries.

``zoo audit RECIPE`` trains the recipe once with ``M`` canaries, each in the training set
with probability 1/2 (:mod:`zoo.audit.canaries`, :mod:`zoo.audit.run`), scores them
(:mod:`zoo.audit.score`) and reports the claimed epsilon next to the lower bound that
``jax_privacy.auditing`` derives from the scores (:func:`zoo.audit.report.audit`).
"""

from zoo.audit.run import MODES

__all__ = ["MODES"]
