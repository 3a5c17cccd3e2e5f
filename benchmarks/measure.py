"""Benchmark: all 9 work profiles, geospec's measure_profiles against a naive baseline.

Clouds: per layer, n tokens in d dimensions, low-rank (rank 8) plus noise around a shared mean
direction (anisotropic, as residual streams are), with a norm growing with depth; y = x plus the
output of a random ReLU MLP (an FFN-like update) whose strength depends on the layer.

Baseline (sequential, same distance matrices): POT's exact GW from POT's default start (the
product coupling), ripser for the degree-1 diagrams, and POT's exact EMD on the square
(m + k) x (m + k) assignment matrix of the two diagrams for W2.

Prints both wall times, their ratio, peak memory (this process and its workers), the largest
relative difference of any profile value from the baseline, and ends with the summary line

    speedup: 12.3  max_rel_diff: 0.004  peak_rss_mb: 850

For gw only a value above the baseline's counts as a difference (a lower value is a better
optimum of the non-convex problem). The default is the full configuration (12 layers, n = 1024,
d = 768; about 20 minutes on 2 cores, mostly the baseline); --layers and --n make it smaller.
"""

from __future__ import annotations

import argparse
import math
import resource
import time

import numpy as np
import ot
import ripser
import torch

from geospec.measure.work import measure_profiles, plugin_instance
from geospec.spec.sections import MeasureSpec

GEOMETRIES = ["raw", "spherical", "hyperbolic"]
STATISTICS = ["shift", "gw", "topology"]
RANK = 8
NOISE = 0.05
HIDDEN = 512


def synthetic_clouds(
    layers: int, n: int, d: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    direction = torch.randn(d, generator=g, dtype=torch.float64)
    direction /= direction.norm()
    clouds = []
    for layer in range(layers):
        depth = layer / max(1, layers - 1)
        basis = torch.randn(RANK, d, generator=g, dtype=torch.float64) / math.sqrt(RANK)
        codes = torch.randn(n, RANK, generator=g, dtype=torch.float64)
        noise = NOISE * torch.randn(n, d, generator=g, dtype=torch.float64)
        x = (2 + 4 * depth) * direction + (1 + 2 * depth) * (codes @ basis + noise)
        w_in = torch.randn(d, HIDDEN, generator=g, dtype=torch.float64) / math.sqrt(d)
        w_out = torch.randn(HIDDEN, d, generator=g, dtype=torch.float64) / math.sqrt(HIDDEN)
        normed = (x - x.mean(0)) / x.std(0).mean()
        update = torch.relu(normed @ w_in) @ w_out
        strength = 0.6 * (1 - 0.7 * depth)  # front-loaded, as the paper reports
        y = x + strength * (1 + 2 * depth) * update
        clouds.append((x.float(), y.float()))
    return clouds


def baseline_w2(a: np.ndarray, b: np.ndarray) -> float:
    """W2 between finite diagrams by POT's exact EMD on the square assignment matrix."""
    m, k = len(a), len(b)
    if m + k == 0:
        return 0.0
    cost = np.zeros((m + k, k + m))
    cost[:m, :k] = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)
    cost[:m, k:] = (((a[:, 1] - a[:, 0]) ** 2) / 2)[:, None]
    cost[m:, :k] = (((b[:, 1] - b[:, 0]) ** 2) / 2)[None, :]
    weights = np.full(m + k, 1.0 / (m + k))
    return math.sqrt(float(ot.emd2(weights, weights, cost, numItermax=100_000_000)) * (m + k))


def baseline_diagram(distances: np.ndarray) -> np.ndarray:
    result = ripser.ripser(distances.astype(np.float32), maxdim=1, distance_matrix=True)
    return np.asarray(result["dgms"][1], dtype=np.float64)


def baseline(clouds: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, list[float]]:
    profiles: dict[str, list[float]] = {f"{s}/{g}": [] for s in STATISTICS for g in GEOMETRIES}
    for x, y in clouds:
        for name in GEOMETRIES:
            geometry = plugin_instance("geometry", name)
            px, py = geometry.prepare(x), geometry.prepare(y)
            profiles[f"shift/{name}"].append(float(geometry.paired(px, py).mean()))
            cx, cy = geometry.pairwise(px).numpy(), geometry.pairwise(py).numpy()
            gw = ot.gromov.gromov_wasserstein2(cx, cy, loss_fun="square_loss")
            profiles[f"gw/{name}"].append(float(gw))
            w2 = baseline_w2(baseline_diagram(cx), baseline_diagram(cy))
            profiles[f"topology/{name}"].append(w2)
    return profiles


def relative_difference(profile: str, fast: float, base: float) -> float:
    if profile.startswith("gw/"):
        return max(0.0, fast - base) / abs(base) if base else max(0.0, fast)
    return abs(fast - base) / abs(base) if base else abs(fast)


def peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, workers) / 1024  # kilobytes on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--n", type=int, default=1024, help="tokens per cloud")
    parser.add_argument("--d", type=int, default=768, help="features per token")
    parser.add_argument("--workers", type=int, default=None, help="default: one per core")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    clouds = synthetic_clouds(args.layers, args.n, args.d, args.seed)
    pairs = [
        MeasureSpec.model_validate({"geometry": g, "statistic": s})
        for s in STATISTICS
        for g in GEOMETRIES
    ]
    print(f"{args.layers} layers, n = {args.n}, d = {args.d}, {len(pairs)} profiles", flush=True)

    start = time.perf_counter()
    fast = measure_profiles(clouds, pairs, workers=args.workers, progress=True)
    fast_s = time.perf_counter() - start
    print(f"geospec:  {fast_s:8.1f} s", flush=True)

    start = time.perf_counter()
    base = baseline(clouds)
    base_s = time.perf_counter() - start
    print(f"baseline: {base_s:8.1f} s", flush=True)

    print(f"\n{'profile':<22}{'max rel diff':>14}{'gw: geospec/baseline (min..max)':>34}")
    worst = 0.0
    for profile, values in fast.items():
        pairs_of_values = list(zip(values, base[profile], strict=True))
        diffs = [relative_difference(profile, f, b) for f, b in pairs_of_values]
        worst = max(worst, *diffs)
        ratio = ""
        if profile.startswith("gw/"):
            ratios = [f / b for f, b in pairs_of_values if b > 0]
            ratio = f"{min(ratios):.3g}..{max(ratios):.3g}" if ratios else "-"
        print(f"{profile:<22}{max(diffs):>14.2e}{ratio:>34}")
    print(
        f"\nspeedup: {base_s / fast_s:.1f}  max_rel_diff: {worst:.3g}  "
        f"peak_rss_mb: {peak_rss_mb():.0f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
