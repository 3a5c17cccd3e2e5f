"""The demand measurement as demand.json records it (torch-free): the measurement, each layer's
power-law fit, the pairs' additivity, the demand profiles, and every other profile's correlation
with the demand (:mod:`geospec.measure.demand` measures, :mod:`geospec.measure.demand_fit` fits);
what makes a stored demand.json measured or fitted again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.records import DEMAND_KEYS
from geospec.spec.sections import DEMAND_PROFILES
from geospec.stats import finite

if TYPE_CHECKING:
    from geospec.measure.demand import Demand

#: Bootstrap resamples of the layers behind each correlation's interval.
BOOTSTRAP = 2000


def measured_record(
    demand: Demand,
    orders: Sequence[Sequence[int]],
    importance: Mapping[str, Any],
    multiple: int,
    loss: Mapping[str, Any],
) -> dict[str, Any]:
    """The reference's measurement as demand.json records it (before the fits): the base loss
    with ``loss`` (what it was measured on), the ``importance`` plugin table that ordered the
    neurons (``orders``), the kept widths (multiples of ``multiple``) and increases per layer,
    and the pairs' additivity."""
    layers = [
        {
            "layer": layer,
            "width": demand.widths[layer],
            "kept": list(demand.kept[layer]),
            "increase": list(demand.increase[layer]),
        }
        for layer in range(len(demand.widths))
    ]
    return {
        "loss": {"base": demand.base, **loss},
        "importance": importance,
        "keep": list(demand.keep),
        "multiple": multiple,
        "layers": layers,
        "additivity": additivity_record(demand),
        "orders": [list(order) for order in orders],
        "fallback": demand.fallback,
    }


def demand_record(
    measured: Mapping[str, Any],
    others: Mapping[str, Sequence[float]],
    keep: Sequence[float],
    pair_keep: float,
    settings: Mapping[str, Any],
    keys: Mapping[str, str | None],
) -> dict[str, Any]:
    """demand.json's content: the ``measured`` record (:func:`measured_record`) with each layer
    fitted at the ``keep`` fractions (the fits are cheap: computed again from the stored
    increases on every write), the demand profiles, every ``other`` profile's correlation with
    them, and the ``settings`` and stage ``keys`` it was measured with."""
    layers = fitted(measured["layers"], keep)
    profiles = profiles_of(layers, keep)
    return {
        "profiles": profiles,
        **measured,
        "layers": layers,
        "correlations": correlations(profiles, others, pair_keep),
        "settings": settings,
        "keys": keys,
    }


def demand_problem(path: Path) -> str | None:
    """Why a demand.json that exists is written again: damaged, or fitted by an earlier geospec
    (its measurement is reused and fitted again)."""
    problem = json_problem(path, *DEMAND_KEYS)
    if problem is not None:
        return problem
    stored = read_json(path)
    fits = [row.get("fit", {}) for row in stored["layers"]]
    if any("exponent_at_bound" not in fit for fit in fits) or any(
        name not in stored["profiles"] for name in DEMAND_PROFILES
    ):
        return f"{path.name} holds fits of an earlier geospec; fitting its measurement again"
    return None


def fitted(layers: Sequence[Mapping[str, Any]], keep: Sequence[float]) -> list[dict[str, Any]]:
    """Each layer's record with the power law fitted to its increases (``fit``)."""
    from geospec.measure.demand_fit import EXPONENT_RANGE, fit_demand

    low, high = EXPONENT_RANGE
    result = []
    for row in layers:
        fit = fit_demand(keep, row["increase"])
        # a_l is not pinned by the data where the search stopped at an end of its range
        at_bound = fit.sensitivity > 0 and not low * 1.001 < fit.exponent < high / 1.001
        result.append(
            {
                **{key: value for key, value in row.items() if key != "fit"},
                "fit": {
                    "lambda": fit.sensitivity,
                    "exponent": fit.exponent,
                    "r2": finite(fit.r2) if fit.r2 is not None else None,
                    "power_law": fit.power_law,
                    "exponent_at_bound": at_bound,
                },
            }
        )
    return result


def additivity_record(demand: Demand) -> dict[str, Any]:
    pairs = [pair.record() for pair in demand.pairs]
    return {
        "keep": demand.pair_keep,
        "slope": finite(demand.additivity_slope) if demand.additivity_slope is not None else None,
        "r2": finite(demand.additivity_r2) if demand.additivity_r2 is not None else None,
        "pairs": pairs,
        "worst": sorted(pairs, key=lambda p: -abs(p["interaction"]))[:5],
    }


def profiles_of(
    layers: Sequence[Mapping[str, Any]], keep: Sequence[float]
) -> dict[str, list[float]]:
    """The demand profiles: fitted lambda and exponent, and the increase at each fraction
    (negative increases, a cut that lowered the loss, become 0: demand is not negative)."""
    profiles = {
        "demand/lambda": [max(row["fit"]["lambda"], 0.0) for row in layers],
        "demand/exponent": [row["fit"]["exponent"] for row in layers],
        "demand/slope": [max(row["fit"]["lambda"], 0.0) * row["fit"]["exponent"] for row in layers],
    }
    for k, fraction in enumerate(keep):
        profiles[f"demand/f{fraction:g}"] = [max(row["increase"][k], 0.0) for row in layers]
    return profiles


def correlations(
    demand: Mapping[str, Sequence[float]],
    others: Mapping[str, Sequence[float]],
    pair_keep: float,
) -> dict[str, dict[str, Any]]:
    """Per other profile: Spearman's rho with the increase at ``pair_keep`` (the measured
    demand), with lambda x a and with lambda (the fit), each with a percentile bootstrap interval
    over layers."""
    from geospec.stats import spearman_interval

    targets = {
        "increase": demand[f"demand/f{pair_keep:g}"],
        "slope": demand["demand/slope"],
        "lambda": demand["demand/lambda"],
    }
    result: dict[str, dict[str, Any]] = {}
    for name, values in others.items():
        if len(values) != len(targets["lambda"]):
            continue  # a profile of another depth (read from a file) is not this model's
        result[name] = {
            target: spearman_interval(values, demand_values, BOOTSTRAP, seed=0)
            for target, demand_values in targets.items()
        }
    return result
