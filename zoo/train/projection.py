"""The fixed input projection of ``data.dp_pca``: its width on the model config, and its values,
fitted once on the training features when a run is built (:mod:`zoo.dp.pca_fit`).

The projection is a leaf of the model (``cfg.input_projection``, e.g. the MLP's ``pca.w``), kept
in every checkpoint and never trained, so ``zoo eval``, ``zoo.load_checkpoint`` and exports apply
it as they apply any weight. A run that starts from a checkpoint (``model.init_from``: a
fine-tune, ``zoo eval``) keeps the checkpoint's projection and fits none.
"""

from __future__ import annotations

import jax
import numpy as np

from zoo.configs import DataConfig
from zoo.dp.pca_fit import PCA_STREAM, private_pca
from zoo.dp.plan import DPPlan
from zoo.errors import ZooError
from zoo.models.paths import dotted, get_path
from zoo.models.registry import ModelConfig


def start_width(source) -> int | None:
    """The width of the start checkpoint's projection, or None (no checkpoint, or none in it)."""
    path = None if source is None else source.model_config.input_projection
    return None if path is None else int(get_path(source.params, path).shape[-1])


def projected_config(cfg: ModelConfig, data: DataConfig, source) -> ModelConfig:
    """``cfg`` reading its input through the projection: ``data.dp_pca`` wide, or as wide as the
    start checkpoint's (which must then have one of that width). Unchanged without either."""
    kept = start_width(source)
    width = kept or data.dp_pca
    if source is not None and data.dp_pca and kept != data.dp_pca:
        has = f"a projection of width {kept}" if kept else "no input projection"
        raise ZooError(
            f"data.dp_pca = {data.dp_pca}, but the start checkpoint (model.init_from) has {has}: a run "
            "that starts from a checkpoint keeps its inputs; drop data.dp_pca (--set data.dp_pca=none)"
        )
    if not width:
        return cfg
    try:
        return cfg.with_input_projection(width)
    except ValueError as error:
        raise ZooError(f"data.dp_pca = {width}: {error}") from None


def fixed_patterns(cfg: ModelConfig) -> tuple[str, ...]:
    """Freeze patterns of the leaves no step trains: the projection's."""
    return () if cfg.input_projection is None else (dotted(cfg.input_projection),)


def fit(
    cfg: ModelConfig, params: dict, features: np.ndarray, plan: DPPlan | None, root: jax.Array | None
) -> dict:
    """``params`` with the projection fitted on the training ``features`` [N, F]: DP-PCA with the
    plan's ``pca_noise_multiplier`` and a key of its own under the run's ``root`` key, or, without
    DP, plain PCA of the same clipped rows."""
    path = cfg.input_projection
    k = int(get_path(params, path).shape[-1])
    sigma = 0.0 if plan is None else plan.mechanism.pca_noise_multiplier
    key = None if plan is None else jax.random.fold_in(root, PCA_STREAM)
    prng = None if plan is None else plan.performance.noise_prng
    projection = private_pca(features, k, noise_multiplier=sigma, key=key, prng=prng)
    return _replace_leaf(params, path, projection)


def _replace_leaf(params: dict, path: tuple[str, ...], value) -> dict:
    head, *rest = path
    if not rest:
        return {**params, head: value}
    return {**params, head: _replace_leaf(params[head], tuple(rest), value)}
