"""The mechanisms' shared settings: one [dp] section per mechanism, over a small population."""

from __future__ import annotations

import dataclasses

import numpy as np

from zoo.configs import DPConfig
from zoo.data.users import group_rows
from zoo.dp.plan import make_plan
from zoo.models.registry import get_config
from zoo.parallel import layout_for

RECORDS = 400
RECORDS_OF = [1, 9, 2, 2, 14, 3, 1, 5, 7, 1] * 6  # 60 users, skewed, 270 records
USERS = group_rows(np.repeat(np.arange(len(RECORDS_OF)), RECORDS_OF))
STEPS = 30

RECORD = DPConfig(enabled=True, noise_multiplier=1.1, expected_batch_size=16, clipping="vmap", delta=1e-4)
ULS = dataclasses.replace(RECORD, unit="user", records_per_user=3, expected_batch_size=12)
# ELS: k = 2 and sigma = 3 keep the mixture's PLD (built point by point) to a second
ELS = dataclasses.replace(
    ULS, sampler="els", expected_batch_size=30, noise_multiplier=3.0, records_per_user=2
)
PCA = dataclasses.replace(RECORD, pca_epsilon=0.5)
SECTIONS = {"dpsgd": RECORD, "uls": ULS, "els": ELS, "dp-pca": PCA}


def plan(dp: DPConfig, steps: int = STEPS, layout=None, **kwargs):
    """``make_plan`` of ``dp`` over the records, or the users under ``dp.unit = "user"``."""
    layout = layout or layout_for(get_config("mlp-s"))
    users = USERS if dp.unit == "user" else None
    return make_plan(dp, RECORDS, steps, layout, seed=3, users=users, **{"microbatch_size": None, **kwargs})


def units(dp: DPConfig) -> int:
    return len(RECORDS_OF) if dp.unit == "user" else RECORDS
