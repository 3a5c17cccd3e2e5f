"""The diagnose stage: what the reference model says about the method's premises.

Per layer: the mean residual-stream norm, the TwoNN intrinsic dimension of the cloud entering the
FFN (with its fit quality), and the layer sensitivity (the loss increase when the FFN sub-layer's
output is scaled by 1 - eps, and when it is removed). Over sampled layer pairs: local additivity
(the joint loss change against the sum of the singles). Against the measured work profiles:
Spearman rank correlations with the residual norm (scale sensitivity: raw work tracks the norm's
growth with depth) and with layer sensitivity.

``diagnostics.json`` holds it all, with ``profiles`` (the per-layer quantities named as in
:data:`geospec.spec.DIAGNOSTIC_PROFILES`) in the same shape as profiles.json, which the solve
stage merges with the measured profiles. Heavy imports happen inside the functions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.errors import GeospecError, UsageError
from geospec.spec import DIAGNOSTIC_PROFILES, MeasureSpec

if TYPE_CHECKING:
    import torch

    from geospec.executor import Context

DIAGNOSTICS_FILE = "diagnostics.json"


def read_diagnostics(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's diagnostics.json, or None when the diagnose stage has not written one."""
    path = Path(run_dir) / DIAGNOSTICS_FILE
    if not path.exists():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise UsageError(f"{path}: not valid JSON ({error}); delete it and rerun") from None
    return data


def diagnostic_profiles(run_dir: str | Path) -> dict[str, list[float]]:
    """The diagnostic profiles the solve stage can use (empty when there are none)."""
    diagnostics = read_diagnostics(run_dir)
    return dict(diagnostics.get("profiles", {})) if diagnostics else {}


def finite(value: float | None) -> float | None:
    """JSON has no NaN: undefined numbers are stored as null."""
    return None if value is None or not math.isfinite(value) else float(value)


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


def scale_sensitive_profiles(entries: Sequence[MeasureSpec]) -> dict[str, bool]:
    """Which measured profiles use a scale-sensitive geometry (``raw`` among the builtins)."""
    from geospec.plugins import get_registries

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


def measure_reference(ctx: Context) -> dict[str, Any]:
    """Everything that needs the reference model: norms, TwoNN, sensitivity, additivity."""
    from rich.progress import Progress

    from geospec.clouds import load_clouds, reference_model
    from geospec.executor import token_data
    from geospec.intrinsic_dimension import two_nn
    from geospec.probe import find_ffn_sites
    from geospec.sensitivity import (
        additivity,
        layer_sensitivity,
        logits_of,
        loss_batches,
        sample_pairs,
    )

    spec = ctx.spec
    settings = spec.diagnose
    seq_len = spec.model.seq_len
    data = token_data(ctx)
    model, width = reference_model(ctx)
    device = next(model.parameters()).device
    batches = loss_batches(data.val, seq_len, settings.windows, settings.batch_size, device)
    sites = find_ffn_sites(model, width, lambda: logits_of(model, batches[0][0][:1]))
    clouds = load_clouds(ctx.run_dir / "clouds")
    pairs = sample_pairs(len(sites), settings.pairs, settings.seed)
    windows = sum(len(x) for x, _ in batches)
    ctx.say(
        f"[bold]diagnose[/]: {len(sites)} layers, loss on {windows} validation windows of "
        f"{seq_len} tokens, eps {settings.eps}, {len(pairs)} layer pairs"
    )
    if len(clouds) != len(sites):
        raise GeospecError(
            f"diagnose: {len(clouds)} probed clouds but the reference has {len(sites)} layers; "
            "rerun with --from probe"
        )
    dimensions = []
    for layer, (x, _) in enumerate(clouds):
        try:
            dimensions.append(two_nn(x, settings.twonn_discard))
        except GeospecError as error:
            raise GeospecError(f"diagnose: layer {layer}: {error}") from None
    norms = residual_norms(_residual_clouds(ctx, model, width, clouds))
    with Progress(console=ctx.console, transient=True, disable=not ctx.console.is_terminal) as bar:
        task = bar.add_task("perturbing", total=2 * len(sites) + len(pairs))

        def step(done: int) -> None:
            bar.advance(task, done)

        sensitivity = layer_sensitivity(model, sites, batches, settings.eps, progress=step)
        pair_effects = additivity(model, sites, batches, sensitivity, pairs, progress=step)
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
        "loss": {
            "base": sensitivity.base,
            "windows": windows,
            "tokens": windows * seq_len,
            "eps": settings.eps,
        },
        "layers": layers,
        "additivity": {
            "perturbation": f"FFN output x {pair_effects.scale:g} in both layers",
            "r2": finite(pair_effects.r2),
            "pairs": [_pair(p) for p in pair_effects.pairs],
            "worst": [_pair(p) for p in pair_effects.worst()],
        },
    }


def _pair(effect: Any) -> dict[str, Any]:
    return {
        "layers": list(effect.layers),
        "joint": effect.joint,
        "sum_of_singles": effect.singles,
        "interaction": effect.interaction,
    }


def _residual_clouds(
    ctx: Context, model: Any, width: int, clouds: list[tuple[torch.Tensor, torch.Tensor]]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The residual stream at the probed tokens: the stored clouds, or (with ``probe.site =
    "ffn"``, whose clouds are normalised FFN inputs and outputs) the same tokens probed again."""
    probe = ctx.spec.probe
    if probe.site == "residual":
        return clouds
    from geospec.executor import token_data
    from geospec.probe import probe_clouds, sample_tokens

    data = token_data(ctx)
    seq_len = ctx.spec.model.seq_len
    skip_ids = [data.eot_id] if probe.skip_special else []
    sample = sample_tokens(
        data.val, seq_len, probe.tokens, probe.seed, probe.sequences, probe.skip_first, skip_ids
    )
    return probe_clouds(
        model, data.val, sample, seq_len, width, site="residual", batch_size=probe.batch_size
    )


def diagnose(ctx: Context, compute_key: str, previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """The content of diagnostics.json: the reference's measurements (reused from ``previous``
    when they were made with the same ``compute_key``) and their correlations with the current
    work profiles."""
    from geospec.spec import measures

    if previous is not None and previous.get("keys", {}).get("compute") == compute_key:
        measured = {k: previous[k] for k in ("loss", "layers", "additivity")}
    else:
        measured = measure_reference(ctx)
    profiles_file = ctx.run_dir / "profiles.json"
    work = json.loads(profiles_file.read_text())["profiles"] if profiles_file.exists() else {}
    layers = measured["layers"]
    return {
        "profiles": profiles_of(layers),
        **measured,
        "correlations": correlations(layers, work, scale_sensitive_profiles(measures(ctx.spec))),
        "settings": ctx.spec.diagnose.model_dump(mode="json", exclude={"enabled"}),
        "keys": {"compute": compute_key, "probe": ctx.keys.get("probe")},
    }
