"""Benchmark: pruning and scoring one arm of SmolLM2-135M on this machine's CPU.

Loads SmolLM2-135M's GGUF (``--gguf PATH``, the gguf extra; without it a Llama of SmolLM2's
shape with random weights), then times each step of one prune unit as the prune stage runs it:
calibration (the activation score over ``--calibration`` windows), allocation (uniform at
``--keep``), the cut, the held-out loss on ``--eval`` windows, and (``--export``) the padded
transformers checkpoint. The unpruned model's loss on the same windows is the baseline measured
in the same run. Prints wall and CPU seconds per step, the peak resident memory, and ends with

    unit_s: 41.2  eval_ratio: 0.93  peak_rss_gb: 1.9

(eval_ratio: the pruned model's eval time over the unpruned one's). The prune stage's cost is
about ``seeds x (calibration + arms x keeps x eval)``: size calibration and eval windows from it.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.cut import pruned
from geospec.prune.hf_export import export_pruned
from geospec.prune.losses import eval_loss
from geospec.prune.score import calibration_windows, neuron_scores
from geospec.shapes.pruned import pruned_dims


def model_of(gguf: str | None) -> torch.nn.Module:
    import transformers as hf

    if gguf:
        path = Path(gguf)
        return hf.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
    torch.manual_seed(0)
    config = hf.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return hf.LlamaForCausalLM(config).eval()


def timed(label: str, step: object) -> tuple[object, float]:
    started, cpu = time.perf_counter(), time.process_time()
    value = step()  # type: ignore[operator]
    wall = time.perf_counter() - started
    print(f"{label}: {wall:.1f} s, {time.process_time() - cpu:.1f} s of CPU", flush=True)
    return value, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help="SmolLM2-135M's GGUF file (default: random weights)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--eval", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--export", action="store_true")
    args = parser.parse_args()

    model = model_of(args.gguf)
    vocab = model.get_input_embeddings().num_embeddings
    tokens = np.random.default_rng(0).integers(0, vocab, (args.calibration + args.eval + 1) * 600)
    ids = torch.as_tensor(tokens[: args.eval * (args.seq_len + 1)].reshape(args.eval, -1))
    batches = [
        (ids[i : i + args.batch_size, :-1], ids[i : i + args.batch_size, 1:])
        for i in range(0, args.eval, args.batch_size)
    ]
    sites = find_ffn_sites(model, 576, lambda: logits_of(model, batches[0][0][:1]))
    importance = create_plugin("importance", {"kind": "activation"})
    print(
        f"{args.gguf or 'random weights, SmolLM2 shape'}: calibration {args.calibration}, eval "
        f"{args.eval} windows of {args.seq_len}; keep {args.keep}; {torch.get_num_threads()} "
        "threads",
        flush=True,
    )
    with torch.no_grad():
        _, base = timed("eval, unpruned (baseline)", lambda: eval_loss(model, batches))
        starts = calibration_windows(tokens, args.seq_len, args.calibration, 0)
        scored, calibrate = timed(
            "calibration (activation scores)",
            lambda: neuron_scores(
                model, sites, importance, tokens, starts, args.seq_len, args.batch_size
            ),
        )
        dims = pruned_dims(30, 576, 1536, 64, args.keep, "swiglu")
        widths = [dims.ffn_width] * 30
        orders = scored[1]  # type: ignore[index]
        with pruned(sites, orders, widths):
            _, evaluate = timed("eval, pruned", lambda: eval_loss(model, batches))
            export = 0.0
            if args.export:
                with tempfile.TemporaryDirectory() as directory:
                    _, export = timed(
                        "export", lambda: export_pruned(model, sites, widths, Path(directory))
                    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"unit_s: {calibrate + evaluate + export:.1f}  eval_ratio: {evaluate / base:.2f}  "
        f"peak_rss_gb: {peak:.2f}"
    )


if __name__ == "__main__":
    main()
