"""Benchmark: the least-squares repair (``prune.repair = "lstsq"``) against one calibration pass.

Loads a GGUF checkpoint (``--gguf PATH``: SmolLM2-135M, Qwen2.5-Coder-0.5B or 1.5B; the gguf
extra), or a Llama of SmolLM2's shape with random weights (``--tiny``: 4 small layers, to check
the script), draws ``--windows`` calibration windows of ``--seq-len`` tokens of bundled Austen
(its own tokenizer's ids are not needed for timing: random ids in the vocabulary), and times,
each in the same process and run:

- ``calibration_pass``: one forward pass of the unpruned model over the windows (the baseline);
- ``moments``: the one-pass repair's statistics (every layer's E[a a^T] in float64, hooked on
  the same pass), and the memory they take;
- ``solve``: every layer's re-fit at ``--keep`` (uniform widths), per layer and in all;
- ``sequential``: the sequential repair of the same cut (moments and re-fit layer by layer on
  the cut and repaired model's activations, the probe's suffix walk);

then prints each against the calibration pass, the goal being the one-pass repair within two
calibration passes and the sequential one within one model pass per layer:

    calibration_pass_s: 4.1
    moments_s: 6.0 (1.46x)  moments_bytes: 566 MB  peak_rss_rise: 610 MB
    solve_s: 3.2 (0.78x)  solve_per_layer_s: 0.11
    one_pass_repair_s: 9.2 (2.24x)
    sequential_s: 17.5 (4.27x; 0.14 passes per layer)
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from pathlib import Path

import torch
from search import model_of  # benchmarks/search.py's: a GGUF file, SmolLM2's shape, or tiny

from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.prune.repair import (
    calibration_moments,
    one_pass_refits,
    sequential_refits,
)
from geospec.shapes.repair import moments_bytes


def peak_rise(call: Callable[[], object]) -> tuple[float, int, object]:
    """Seconds ``call`` took, how far this process's peak resident memory rose above where it
    stood (Linux: the kernel's peak reset first), and what it returned."""

    def status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS")
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, status("VmHWM") - before, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--damping", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--no-sequential", action="store_true")
    parser.add_argument("--float64", action="store_true", help="also time float64 products")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = model_of(args.gguf, args.tiny)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (args.windows, args.seq_len), generator=generator)
    batches = [(x, x) for x in ids.split(args.batch_size)]
    sites = find_ffn_sites(model, model.config.hidden_size, lambda: logits_of(model, ids[:1, :8]))
    width = model.config.intermediate_size
    layers = len(sites)
    kept = max(64, round(args.keep * width / 64) * 64) if width >= 128 else width // 2
    tokens = args.windows * args.seq_len
    print(f"model: {layers} layers x {width} neurons, d_model {model.config.hidden_size}; "
          f"{args.windows} windows x {args.seq_len} = {tokens} tokens; keep {kept}; "
          f"threads {torch.get_num_threads()}")  # fmt: skip

    def calibration_pass() -> None:
        with torch.no_grad():
            for inputs, _ in batches:
                logits_of(model, inputs)

    calibration_pass()  # warm-up: first-use costs are not the pass's
    base, _, _ = peak_rise(calibration_pass)
    print(f"calibration_pass_s: {base:.2f}")
    seconds, rise, moments = peak_rise(lambda: calibration_moments(model, sites, batches))
    held = layers * moments_bytes(width) / 1e6
    print(f"moments_s: {seconds:.2f} ({seconds / base:.2f}x)  moments_bytes: {held:.0f} MB  "
          f"peak_rss_rise: {rise / 1e6:.0f} MB  (each batch's product in float32)")  # fmt: skip
    orders = [list(range(width)) for _ in sites]
    widths = [kept] * layers
    solve, _, refits = peak_rise(
        lambda: one_pass_refits(sites, moments, orders, widths, args.damping)  # type: ignore[arg-type]
    )
    if args.float64:  # the products in float64 too: their time and the re-fit's difference
        exact_s, _, exact = peak_rise(
            lambda: calibration_moments(model, sites, batches, torch.float64)
        )
        again = one_pass_refits(sites, exact, orders, widths, args.damping)  # type: ignore[arg-type]
        gap = max(
            float((one.weight - two.weight).abs().max() / two.weight.abs().max())
            for one, two in zip(refits, again, strict=True)  # type: ignore[call-overload]
            if one is not None and two is not None
        )
        print(f"moments_float64_s: {exact_s:.2f} ({exact_s / base:.2f}x)  float32 products: "
              f"largest re-fit weight difference {gap:.1e} of the layer's largest")  # fmt: skip
        exact = again = None
    print(f"solve_s: {solve:.2f} ({solve / base:.2f}x)  solve_per_layer_s: {solve / layers:.3f}")
    print(f"one_pass_repair_s: {seconds + solve:.2f} ({(seconds + solve) / base:.2f}x)")
    moments = refits = None
    if args.no_sequential:
        return
    walked, rise, _ = peak_rise(
        lambda: sequential_refits(model, sites, batches, orders, widths, args.damping)
    )
    passes = walked / base / layers
    print(f"sequential_s: {walked:.2f} ({walked / base:.2f}x; {passes:.2f} passes per layer)  "
          f"peak_rss_rise: {rise / 1e6:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
