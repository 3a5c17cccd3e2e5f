"""How many paired seeds each comparison of a pilot run needs: from its paired standard
deviations, the seeds with which the two-sided paired t-test at the report's level detects a
given difference with the given power (``geospec plan``)."""

from __future__ import annotations

from typing import Any

from geospec.report.results import comparison_families
from geospec.stats import seeds_needed, seeds_to_reach


def plan_seeds(
    results: dict[str, Any], effect: float, power: float = 0.8, holm: bool = False
) -> dict[str, Any]:
    """The seeds each comparison of ``results`` (the shape of results.json) needs to detect a
    difference of ``effect`` in validation loss.

    The level is 1 - confidence (two-sided); with ``holm`` it is divided by the number of
    comparisons in each family (against the baseline; derived arms against their source; the
    spec's report.compare pairs), the strictest step of Holm's procedure. ``seeds`` is None for
    a comparison whose pilot has fewer than two paired seeds (no spread to plan from).
    ``exact_minimum`` is the fewest seeds with which the exact sign-flip test can reach
    ``exact_level`` (the strictest level) at all.
    """
    alpha = 1 - results["confidence"]
    families = comparison_families(
        results["arms"], results.get("comparisons", []), results["baseline"]
    )
    comparisons = []
    strictest = alpha
    for found in families.values():
        level = alpha / len(found) if holm and found else alpha
        strictest = min(strictest, level)
        for name, against, vs in found:
            sd = vs.get("sd")
            comparisons.append(
                {
                    "arm": name,
                    "against": against,
                    "pilot_seeds": vs["n"],
                    "mean": vs["mean"],
                    "sd": sd,
                    "alpha": level,
                    "seeds": None if sd is None else seeds_needed(sd, effect, level, power),
                }
            )
    return {
        "effect": effect,
        "power": power,
        "alpha": alpha,
        "holm": holm,
        "exact_level": strictest,
        "exact_minimum": seeds_to_reach(strictest),
        "comparisons": comparisons,
    }
