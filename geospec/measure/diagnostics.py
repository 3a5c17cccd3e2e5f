"""Per-layer diagnostics computed from measurements: residual-stream norms, the record of the
reference's measurement (diagnostics.json's ``loss``, ``layers`` and ``additivity``), Spearman
rank correlations of the work profiles with the residual norm and with layer sensitivity, and the
diagnostic profiles the solver can use (named as in :data:`DIAGNOSTIC_PROFILES`).

Torch and scipy are imported by the functions that compute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from geospec.spec.sections import DIAGNOSTIC_PROFILES
from geospec.stats import finite

if TYPE_CHECKING:
    import torch

    from geospec.measure.intrinsic_dimension import TwoNN
    from geospec.measure.suffix import Perturbations
    from geospec.measure.work import MeasureLike


def spearman(a: Sequence[float], b: Sequence[float]) -> dict[str, float | None] | None:
    """Spearman's rank correlation and its p-value; None when either side is constant (or the
    lengths differ, or there are fewer than 3 layers)."""
    if len(a) != len(b) or len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    from scipy import stats

    rho, p = stats.spearmanr(a, b)
    return {"rho": finite(float(rho)), "p": finite(float(p))}


def residual_norms(
    clouds: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> list[tuple[float, float]]:
    """Per layer: the mean norm of the states entering (x) and leaving (y) the FFN sub-layer."""
    return [
        (float(x.double().norm(dim=1).mean()), float(y.double().norm(dim=1).mean()))
        for x, y in clouds
    ]


def measured_record(
    dimensions: Sequence[TwoNN],
    norms: Sequence[tuple[float, float]],
    perturbations: Perturbations,
    loss: Mapping[str, Any],
) -> dict[str, Any]:
    """The reference's measurement as diagnostics.json records it: the base loss with ``loss``
    (what it was measured on), each layer's residual norms (in, out), TwoNN fit and loss
    sensitivities, and the layer pairs' additivity."""
    sensitivity, pair_effects = perturbations.sensitivity, perturbations.additivity
    layers = [
        {
            "layer": layer,
            "residual_norm": norms[layer][0],
            "residual_norm_out": norms[layer][1],
            "twonn": {
                "dimension": dim.dimension,
                "r2": finite(dim.r2),
                "discarded": dim.discarded,
                "duplicates": dim.duplicates,
            },
            "loss_scale": sensitivity.scale[layer],
            "loss_remove": sensitivity.remove[layer],
        }
        for layer, dim in enumerate(dimensions)
    ]
    return {
        "loss": {"base": sensitivity.base, **loss},
        "layers": layers,
        "additivity": {
            "perturbation": f"FFN output x {pair_effects.scale:g} in both layers",
            "r2": finite(pair_effects.r2),
            "pairs": [pair.record() for pair in pair_effects.pairs],
            "worst": [pair.record() for pair in pair_effects.worst()],
        },
    }


def correlations(
    layers: Sequence[Mapping[str, Any]],
    profiles: Mapping[str, Sequence[float]],
    scale_sensitive: Mapping[str, bool],
) -> dict[str, dict[str, Any]]:
    """Per work profile: Spearman with the residual norm and with both layer sensitivities."""
    norm = [row["residual_norm"] for row in layers]
    scaled = [row["loss_scale"] for row in layers]
    removed = [row["loss_remove"] for row in layers]
    return {
        name: {
            "scale_sensitive": scale_sensitive.get(name, False),
            "residual_norm": spearman(values, norm),
            "sensitivity_scale": spearman(values, scaled),
            "sensitivity_remove": spearman(values, removed),
        }
        for name, values in profiles.items()
    }


def scale_sensitive_profiles(entries: Sequence[MeasureLike]) -> dict[str, bool]:
    """Which measured profiles use a scale-sensitive geometry (``raw`` among the builtins)."""
    from geospec.registry.loading import get_registries

    geometries = get_registries()["geometry"]
    return {
        entry.profile: bool(
            entry.geometry.kind in geometries
            and geometries.get(entry.geometry.kind).cls.scale_sensitive  # type: ignore[attr-defined]
        )
        for entry in entries
    }


def profiles_of(layers: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The diagnostic profiles, in :data:`DIAGNOSTIC_PROFILES` order. Sensitivities below zero
    (the perturbation lowered the loss) become 0: a loss sensitivity is not negative."""
    scale, remove, dimension, norm = DIAGNOSTIC_PROFILES
    return {
        scale: [max(row["loss_scale"], 0.0) for row in layers],
        remove: [max(row["loss_remove"], 0.0) for row in layers],
        dimension: [row["twonn"]["dimension"] for row in layers],
        norm: [row["residual_norm"] for row in layers],
    }


def diagnostics_record(
    measured: Mapping[str, Any],
    work: Mapping[str, Sequence[float]],
    scale_sensitive: Mapping[str, bool],
    settings: Mapping[str, Any],
    keys: Mapping[str, str | None],
) -> dict[str, Any]:
    """diagnostics.json's content: the diagnostic profiles of the reference's ``measured``
    record (:func:`measured_record`), the record itself, the ``work`` profiles' correlations
    with it, and the ``settings`` and stage ``keys`` it was measured with."""
    layers = measured["layers"]
    return {
        "profiles": profiles_of(layers),
        **measured,
        "correlations": correlations(layers, work, scale_sensitive),
        "settings": settings,
        "keys": keys,
    }
