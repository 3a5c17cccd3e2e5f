"""Benchmark: the held-out loss of a pretrained model at this CPU's limit (issue 45).

For each model (``--smollm2 PATH``: SmolLM2-135M's GGUF, pruned to ``--keep`` of its FFN neurons,
every layer keeping its best neurons by the activation score of 4 calibration windows;
``--qwen PATH``: Qwen2.5-0.5B's GGUF, unpruned) the loss on ``--windows`` validation windows of
256 tokens of bundled Austen is computed, each way in a process of its own (its peak resident
memory is its own):

- ``transformers``: the baseline, plain transformers' float32 forward and cross-entropy;
- ``float32``: geospec's held-out loss (``geospec.prune.losses.window_losses``) as the prune
  stage computes it, the pruned model at its true widths;
- ``bfloat16``: the same under ``compute_dtype = "bfloat16"`` (autocast, float32 weights);
- ``bf16-weights``: the model loaded in bfloat16 (``reference.dtype = "bfloat16"``);
- ``masked`` (pruned models only): the full-width model with the cut neurons zeroed, as a
  search's suffix losses see it, in float32 and in bfloat16.

Every way runs on ``--threads`` threads (default: the cores this process has), the windows in
batches of 4, one warm-up batch first. Prints, per model and way, tokens/s, the ratio to the
baseline measured in the same run, the peak RSS, and the mean loss with its largest per-window
difference from the float32 one, and ends with one line per model:

    smollm2-135m@0.5: bfloat16 2.31x transformers' float32, masked/true 1.52x
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WAYS = ("transformers", "float32", "bfloat16", "bf16-weights", "masked", "masked-bfloat16")
SEQ_LEN = 256
BATCH = 4


def load(path: str, dtype: str) -> Any:
    import torch
    import transformers as hf

    gguf = Path(path)
    return hf.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype)
    ).eval()


def windows(path: str, count: int, held_out: bool = True) -> tuple[Any, Any]:
    """``count`` windows of bundled Austen in the model's own tokenizer, inputs and next-token
    targets: the first of its last tenth (held out), or of its start (calibration)."""
    import torch
    import transformers as hf

    from geospec.engine.corpus import bundled_path

    gguf = Path(path)
    tokenizer = hf.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with gzip.open(bundled_path("austen"), "rt", encoding="utf-8") as file:
        text = file.read()
    part = text[-len(text) // 10 :] if held_out else text[: len(text) // 10]
    ids = tokenizer(part)["input_ids"]
    rows = torch.tensor(ids[: count * (SEQ_LEN + 1)]).view(count, SEQ_LEN + 1)
    return rows[:, :-1], rows[:, 1:]


def one(way: str, path: str, keep: float | None, count: int, threads: int) -> dict[str, Any]:
    """Compute the loss one way, in this process; its timings, losses and peak memory."""
    import torch
    import torch.nn.functional as F

    from geospec.engine.precision import computing
    from geospec.measure.cut import zeroed_neurons
    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.plugin import create_plugin
    from geospec.prune.cut import pruned
    from geospec.prune.losses import window_losses
    from geospec.prune.score import calibration_windows, neuron_scores

    torch.set_num_threads(threads)
    model = load(path, "bfloat16" if way == "bf16-weights" else "float32")
    inputs, targets = windows(path, count)
    batches = list(zip(inputs.split(BATCH), targets.split(BATCH), strict=True))
    d_model = model.get_input_embeddings().embedding_dim
    sites = find_ffn_sites(model, d_model, lambda: logits_of(model, inputs[:1, :8]))
    cut: Any = None
    if keep is not None:  # every layer keeps its best neurons by the activation score
        calibration = windows(path, 4, held_out=False)[0].flatten().numpy()
        starts = calibration_windows(calibration, SEQ_LEN, 4, seed=0)
        importance = create_plugin("importance", {"kind": "activation"})
        _, orders = neuron_scores(
            model, sites, importance, calibration, starts, SEQ_LEN, BATCH
        )  # fmt: skip
        width = len(orders[0])
        kept = int(width * keep) // 64 * 64
        if way.startswith("masked"):
            cut = [
                zeroed_neurons(s.ffn, order[kept:]) for s, order in zip(sites, orders, strict=True)
            ]
        else:
            cut = [pruned(sites, orders, [kept] * len(sites))]
    dtype = "bfloat16" if way in ("bfloat16", "masked-bfloat16") else "float32"

    def losses() -> list[float]:
        if way != "transformers":
            return window_losses(model, batches)
        found: list[float] = []
        with torch.no_grad():
            for x, y in batches:
                logits = model(input_ids=x).logits
                per_token = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
                found.extend(per_token.view(y.shape).mean(dim=1).tolist())
        return found

    from contextlib import ExitStack

    with ExitStack() as stack, computing(dtype, "cpu"):
        for context in cut or []:
            stack.enter_context(context)
        warm = batches
        batches = batches[:1]
        losses()  # warm-up: one batch
        batches = warm
        started = time.perf_counter()
        found = losses()
        seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"seconds": seconds, "tokens": count * SEQ_LEN, "losses": found, "peak": peak}


def measure(way: str, path: str, keep: float | None, count: int, threads: int) -> dict[str, Any]:
    """:func:`one` in a fresh process (its peak memory its own)."""
    command = [sys.executable, __file__, "--one", way, "--path", path, "--windows", str(count)]
    command += ["--threads", str(threads)] + (["--keep", str(keep)] if keep is not None else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{way} on {path} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def report(name: str, path: str, keep: float | None, count: int, threads: int) -> str:
    ways = [w for w in WAYS if keep is not None or not w.startswith("masked")]
    results = {way: measure(way, path, keep, count, threads) for way in ways}
    base = results["transformers"]
    exact = results["float32"]["losses"]
    print(f"\n{name}: {count} windows of {SEQ_LEN} tokens, {threads} threads")
    print(f"{'way':<16}{'tokens/s':>10}{'x base':>8}{'peak GB':>9}{'loss':>9}{'max |Δ|':>9}")
    for way, found in results.items():
        rate = found["tokens"] / found["seconds"]
        ratio = base["seconds"] / found["seconds"]
        mean = sum(found["losses"]) / len(found["losses"])
        moved = max(abs(a - b) for a, b in zip(found["losses"], exact, strict=True))
        print(
            f"{way:<16}{rate:>10.0f}{ratio:>8.2f}{found['peak'] / 1e9:>9.2f}{mean:>9.4f}"
            f"{moved:>9.4f}"
        )
    summary = f"{name}: bfloat16 {base['seconds'] / results['bfloat16']['seconds']:.2f}x "
    summary += "transformers' float32"
    if keep is not None:
        ratio = results["masked"]["seconds"] / results["float32"]["seconds"]
        summary += f", masked/true widths {ratio:.2f}x in float32"
    return summary


def main() -> None:
    from geospec.hardware import available_cores

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", help="SmolLM2-135M's GGUF")
    parser.add_argument("--qwen", help="Qwen2.5-0.5B's GGUF")
    parser.add_argument("--keep", type=float, default=0.5, help="SmolLM2's kept share")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--threads", type=int, default=available_cores())
    parser.add_argument("--one", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        keep = args.keep if "--keep" in sys.argv else None
        print(json.dumps(one(args.one, args.path, keep, args.windows, args.threads)))
        return
    lines = []
    if args.smollm2:
        name = f"smollm2-135m@{args.keep:g}"
        lines.append(report(name, args.smollm2, args.keep, args.windows, args.threads))
    if args.qwen:
        lines.append(report("qwen2.5-0.5b", args.qwen, None, args.windows, args.threads))
    if not lines:
        parser.error("give --smollm2 and/or --qwen")
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
