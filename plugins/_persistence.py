"""Vietoris–Rips persistence diagrams of a distance matrix, exact, with a certified shortcut.

Diagrams are computed by giotto-ph (``ripser_parallel``) on the float32 distance matrix, like
ripser. Computing all of degree 1 means working up to the enclosing radius, which for n = 1024
points covers almost every edge, although the last degree-1 class usually dies far earlier.

The shortcut (degree 1 only) computes the filtration up to a threshold t and proves that
nothing was missed:

1. The diagram of the filtration cut at t holds every bar of the full diagram that is born
   before t, bars still alive at t appear as infinite. So if no degree-1 bar is infinite,
   every bar born before t is exact.
2. A degree-1 bar of positive length can only be born at an edge (a, b) with d(a, b) >= t that
   closes a cycle. It cannot if some third point c has max(d(a, c), d(b, c)) < d(a, b): the
   triangle abc enters together with the edge (same filtration value, the edge is its youngest
   face), so the edge is either negative or paired at once (a zero-length bar, not reported).
   Nor can it if b is the strict nearest neighbour of a (a is isolated until the edge enters,
   so the edge merges components). Edges longer than the enclosing radius always have such a
   witness (the centre).

:func:`certified_threshold` finds the smallest t that step 2 proves for every longer edge;
:func:`rips_diagram` raises t until step 1 holds, falling back to the full computation. The
result is the same diagram as the full computation, bar for bar (the tests check it).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

#: The cut starts at this fraction of the edges (shortest first): degree-1 bars had died there
#: in the clouds tried. While bars are still alive at the cut, the fraction doubles.
START_FRACTION = 0.05
#: Beyond this share of the edges below the enclosing radius the full computation is as fast.
FULL_SHARE = 0.5
#: Pairs left after the band tests are checked one by one, this many at a time.
CHUNK = 4096


def rips_diagram(distances: np.ndarray, degree: int) -> np.ndarray:
    """The degree-``degree`` Vietoris–Rips diagram of ``distances`` as (birth, death) rows.

    Deaths may be ``inf`` (the one degree-0 class that never dies). Bars of zero length are
    not reported (as in ripser).
    """
    d32 = np.ascontiguousarray(distances, dtype=np.float32)
    if degree != 1 or len(d32) < 8:
        return _ripser(d32, degree, np.inf)
    # Cuts are chosen by rank (a fraction of the edges), so that a geometry whose distances
    # are an increasing function of another's (hyperbolic of spherical) gets the same cuts.
    lengths = np.sort(d32[np.triu_indices(len(d32), 1)])
    enclosing = float(d32.max(axis=1).min())
    below_enclosing = int(np.searchsorted(lengths, enclosing, side="right"))
    levels = band_levels(lengths, below_enclosing)
    threshold = certified_threshold(d32, levels)
    inside = int(np.searchsorted(lengths, threshold, side="right"))
    while inside < FULL_SHARE * below_enclosing:
        bars = _ripser(d32, degree, threshold)
        if not np.isinf(bars[:, 1]).any():
            return bars
        inside = min(2 * inside, len(lengths))  # twice the edges
        threshold = max(threshold, float(lengths[inside - 1]))
    return _ripser(d32, degree, np.inf)


def band_levels(lengths: np.ndarray, below_enclosing: int) -> list[float]:
    """Edge lengths at fractions START/2, START, 2 START, ... of the edges, to the enclosing
    radius: the cut starts at the second; band i, lengths in (level i, level i+1], is tested for
    witnesses within level i."""
    fraction = START_FRACTION / 2
    levels: list[float] = []
    while True:
        index = min(int(fraction * (len(lengths) - 1)), below_enclosing - 1)
        level = float(lengths[index])
        if not levels or level > levels[-1]:
            levels.append(level)
        if index >= below_enclosing - 1:
            return levels
        fraction *= 2


def _ripser(d32: np.ndarray, degree: int, threshold: float) -> np.ndarray:
    from gph import ripser_parallel

    result = ripser_parallel(
        d32, metric="precomputed", maxdim=degree, thresh=threshold, n_threads=1
    )
    return np.asarray(result["dgms"][degree], dtype=np.float64).reshape(-1, 2)


def certified_threshold(d32: np.ndarray, levels: list[float]) -> float:
    """A cut t >= ``levels[1]`` such that no edge of length >= t can start a degree-1 bar.

    ``levels`` are increasing edge lengths, the last one the enclosing radius. Edges in the cut
    are those of length <= t; the returned value is above the longest uncertified edge, so
    that edge is inside whichever way the cut treats ties.
    """
    d = torch.from_numpy(d32)
    start = levels[min(1, len(levels) - 1)]
    pending = torch.triu((d >= start) & (d <= levels[-1]), diagonal=1)
    pending &= ~_strict_nearest_neighbour_edges(d)
    for low, high in itertools.pairwise(levels):
        band = pending & (d > low) & (d <= high)
        if not band.any():
            continue
        within = (d <= low).to(torch.float32)
        common = within @ within  # common[a, b] = number of points within `low` of both
        pending &= ~(band & (common > 0))
    longest = _longest_without_witness(d, pending)
    if longest is None:
        return start
    return float(np.nextafter(np.float32(max(longest, start)), np.float32(np.inf)))


def _strict_nearest_neighbour_edges(d: torch.Tensor) -> torch.Tensor:
    """Edges (a, b) where b is strictly nearer to a than any other point (or vice versa)."""
    n = len(d)
    others = d.clone()
    others.fill_diagonal_(float("inf"))
    nearest, index = others.topk(2, dim=1, largest=False)
    strict = nearest[:, 0] < nearest[:, 1]
    edges = torch.zeros(n, n, dtype=torch.bool)
    rows = torch.arange(n)[strict]
    edges[rows, index[strict, 0]] = True
    return edges | edges.T


def _longest_without_witness(d: torch.Tensor, pending: torch.Tensor) -> float | None:
    """The longest pending edge (a, b) with no c: max(d(a, c), d(b, c)) < d(a, b), if any."""
    a, b = pending.nonzero(as_tuple=True)
    longest: float | None = None
    for i in range(0, len(a), CHUNK):
        rows, cols = a[i : i + CHUNK], b[i : i + CHUNK]
        length = d[rows, cols]
        # c = a or c = b gives max = d(a, b), never strictly less: no need to exclude them.
        detour = torch.maximum(d[rows], d[cols]).min(dim=1).values
        failed = length[detour >= length]
        if len(failed):
            top = float(failed.max())
            longest = top if longest is None else max(longest, top)
    return longest
