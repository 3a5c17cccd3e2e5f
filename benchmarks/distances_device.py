"""Benchmark: distance matrices in float32 on the run's device against float64 on the CPU.

For each builtin geometry, on one probe-like cloud (``--n`` tokens of width ``--d``: low-rank
structure, an offset from the origin), times ``geometry.pairwise`` of the prepared points in
float64 on the CPU (what a CPU run computes) and
:func:`geospec.measure.work.pairwise_distances` on ``--device`` (what a GPU run computes: the
points moved there in float32, the matrix brought back in float64, the transfers included), and
prints the largest relative difference. Then measures three profiles on ``--layers`` small
clouds both ways and prints how far the profiles moved. Ends with one line per geometry and one
for the profiles:

    raw         n: N  d: D  cpu64_s: S  device32_s: S  speedup: R  max_rel_diff: E
    profiles    layers: L  n: N  max_rel_diff: E

``--device`` defaults to cuda when there is one, else the CPU (then the float32 path runs on the
CPU: a check that it runs, not a speed figure). The bound every distance obeys is in
docs/engine.md ("Distributed") and checked by tests/test_distances_on_device.py.
"""

from __future__ import annotations

import argparse
import time

import torch
from geospec_plugins.geometries import Hyperbolic, Raw, Spherical

from geospec.measure.work import measure_profiles, pairwise_distances

PAIRS = ["shift/spherical", "gw/raw", "topology/hyperbolic"]


def cloud(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g) @ torch.randn(8, d, generator=g)
    return (x + 0.1 * torch.randn(n, d, generator=g) + 3.0).double()


def timed(work: object) -> tuple[float, torch.Tensor]:
    assert callable(work)
    started = time.perf_counter()
    value = work()
    return time.perf_counter() - started, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--d", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--profile-n", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    x = cloud(args.n, args.d, 0)
    if device.type == "cuda":  # CUDA's start and the kernels' first load are not the distances
        pairwise_distances(Raw(), Raw().prepare(x[:64]), device)
        torch.cuda.synchronize(device)
    for geometry in (Raw(), Spherical(), Hyperbolic()):
        points = geometry.prepare(x)
        cpu_s, exact = timed(lambda g=geometry, p=points: g.pairwise(p))
        device_s, got = timed(lambda g=geometry, p=points: pairwise_distances(g, p, device))
        off = ~torch.eye(len(points), dtype=torch.bool)
        relative = float(((got - exact).abs()[off] / exact[off]).max())
        print(
            f"{type(geometry).__name__.lower():<11} n: {args.n}  d: {args.d}  cpu64_s: {cpu_s:.2f}"
            f"  device32_s: {device_s:.2f}  speedup: {cpu_s / device_s:.1f}  "
            f"max_rel_diff: {relative:.2g}",
            flush=True,
        )
    clouds = []
    for layer in range(args.layers):
        x = cloud(args.profile_n, args.d, layer + 1)
        clouds.append((x, x + 0.3 * torch.tanh(x)))
    on_cpu = measure_profiles(clouds, PAIRS, workers=1, progress=False)
    on_device = measure_profiles(clouds, PAIRS, workers=1, progress=False, device=device)
    if device.type != "cuda":  # the measurement sends only CUDA GPUs the float32 path
        print("profiles    (the measurement computes in float64 off CUDA: identical by design)")
    moved = max(
        abs(a - b) / abs(a) if a else abs(b)
        for name in PAIRS
        for a, b in zip(on_cpu[name], on_device[name], strict=True)
    )
    print(f"profiles    layers: {args.layers}  n: {args.profile_n}  max_rel_diff: {moved:.2g}")


if __name__ == "__main__":
    main()
