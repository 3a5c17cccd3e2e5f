"""Rounding real-valued widths to multiples while keeping their sum exactly on budget."""

from __future__ import annotations

import math
from collections.abc import Sequence


def round_to_budget(
    values: Sequence[float],
    budget: int,
    multiple: int,
    lower: int | None = None,
    upper: int | None = None,
) -> list[int]:
    """Largest-remainder rounding to multiples of ``multiple`` with ``sum == budget`` exactly.

    Each width is first floored to a multiple (clipped into ``[lower, upper]``, rounded inward to
    multiples); the units still missing from the budget go, one multiple each, to the widths with
    the largest remainders (or are taken from the smallest ones when clipping overshot). Raises
    ``ValueError`` when no such rounding exists.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    if budget % multiple:
        raise ValueError(f"budget {budget} is not a multiple of {multiple}")
    n = len(values)
    if n == 0:
        raise ValueError("no widths to round")
    lo = math.ceil((lower if lower is not None else multiple) / multiple)
    hi = math.floor(upper / multiple) if upper is not None else budget // multiple
    target = budget // multiple
    if lo > hi or n * lo > target or n * hi < target:
        raise ValueError(
            f"{n} widths in [{lo * multiple}, {hi * multiple}] (multiples of {multiple}) cannot sum "
            f"to {budget}: feasible sums are {n * lo * multiple}..{n * hi * multiple}"
        )
    scaled = [v / multiple for v in values]
    units = [min(max(math.floor(x), lo), hi) for x in scaled]
    missing = target - sum(units)
    while missing > 0:
        i = max((j for j in range(n) if units[j] < hi), key=lambda j: (scaled[j] - units[j], -j))
        units[i] += 1
        missing -= 1
    while missing < 0:
        i = min((j for j in range(n) if units[j] > lo), key=lambda j: (scaled[j] - units[j], j))
        units[i] -= 1
        missing += 1
    return [u * multiple for u in units]
