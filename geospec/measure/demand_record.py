"""The demand measurement as demand.json records it (torch-free): each layer's power-law fit,
the pairs' additivity, the demand profiles, and every other profile's correlation with the
demand (:mod:`geospec.measure.demand` measures, :mod:`geospec.measure.demand_fit` fits)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from geospec.stats import finite

if TYPE_CHECKING:
    from geospec.measure.demand import Demand

#: Bootstrap resamples of the layers behind each correlation's interval.
BOOTSTRAP = 2000


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
    pairs: list[dict[str, Any]] = [
        {
            "layers": list(p.layers),
            "joint": p.joint,
            "sum_of_singles": p.singles,
            "interaction": p.interaction,
        }
        for p in demand.pairs
    ]
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
