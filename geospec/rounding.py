"""Rounding real-valued widths to multiples while keeping their sum exactly on budget."""

from __future__ import annotations

import math
from collections.abc import Sequence

from geospec.errors import GeospecError

# Ratios such as 0.3 * 640 land a hair beside a whole multiple in floating point; bounds within this
# many multiples of a whole one are taken as that whole one so they are not pushed one step inward.
_SNAP = 1e-9


class InfeasibleBudget(GeospecError, ValueError):
    """No widths within the bounds, in the required multiples, sum to the budget (exit status 2).

    It is also a ``ValueError`` so that code written against the earlier plain-``ValueError``
    contract of :func:`round_to_budget` keeps working.
    """

    exit_code = 2


def units_between(lower: float, upper: float, multiple: int) -> tuple[int, int]:
    """The smallest and largest whole number of ``multiple``-s inside ``[lower, upper]``."""
    return math.ceil(lower / multiple - _SNAP), math.floor(upper / multiple + _SNAP)


def round_to_budget(
    values: Sequence[float],
    budget: int,
    multiple: int,
    lower: int | None = None,
    upper: int | None = None,
    priority: Sequence[float] | None = None,
) -> list[int]:
    """Largest-remainder rounding to multiples of ``multiple`` with ``sum == budget`` exactly.

    Each width is first floored to a multiple (clipped into ``[lower, upper]``, rounded inward to
    multiples; ``lower`` defaults to one multiple and ``upper`` to the budget); the units still
    missing from the budget go, one multiple each, to the widths with the largest remainders (or
    are taken from the smallest ones when clipping overshot). Equal remainders are decided by
    ``priority`` (higher first, for example the work behind each width), then by layer order.

    When the values lie inside the bounds and sum to the budget, each one moves by less than one
    multiple and a larger value never ends below a smaller one. Raises :class:`InfeasibleBudget`
    (a ``ValueError``) when no such rounding exists, and ``ValueError`` for a bad multiple or
    non-finite values.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    n = len(values)
    if n == 0:
        raise ValueError("no widths to round")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"widths to round must be finite numbers, got {list(values)}")
    if budget % multiple:
        raise InfeasibleBudget(f"budget {budget} is not a multiple of {multiple}")
    lo, hi = units_between(
        lower if lower is not None else multiple, upper if upper is not None else budget, multiple
    )
    target = budget // multiple
    if lo > hi or n * lo > target or n * hi < target:
        raise InfeasibleBudget(
            f"{n} widths in [{lo * multiple}, {hi * multiple}] (multiples of {multiple}) "
            "cannot sum "
            f"to {budget}: feasible sums are {n * lo * multiple}..{n * hi * multiple}"
        )
    rank = list(priority) if priority is not None else [0.0] * n
    if len(rank) != n:
        raise ValueError(f"{len(rank)} priorities for {n} widths")
    scaled = [v / multiple for v in values]
    units = [min(max(math.floor(x), lo), hi) for x in scaled]
    missing = target - sum(units)
    while missing > 0:
        i = max(
            (j for j in range(n) if units[j] < hi),
            key=lambda j: (scaled[j] - units[j], rank[j], -j),
        )
        units[i] += 1
        missing -= 1
    while missing < 0:
        i = min(
            (j for j in range(n) if units[j] > lo), key=lambda j: (scaled[j] - units[j], rank[j], j)
        )
        units[i] -= 1
        missing += 1
    return [u * multiple for u in units]
