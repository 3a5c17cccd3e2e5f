"""Benchmark: one healing step of a pruned SmolLM2-135M in geospec's engine against the same step
in plain transformers, and what a healing study costs on this machine.

Loads SmolLM2-135M's GGUF (``--gguf PATH``, the gguf extra; without it a Llama of SmolLM2's
shape with random weights), prunes it to ``--keep`` of its FFN neurons (the first and last
layers whole, the rest uniform: uneven widths, as a pruned model has) and stores it at its true
widths, then times optimizer steps of ``--batch-size`` windows of ``--seq-len`` tokens (AdamW,
the loss backpropagated through the whole model) two ways, each after ``--warmup`` untimed steps:

- transformers: the model ``geospec.load_pruned`` reads (a ``LlamaForCausalLM`` whose layers
  have their own widths), its own loss from ``labels``;
- geospec: the same weights imported into geospec's engine (:func:`import_llama`), the loss as
  ``geospec prune``'s healing computes it (``heal.distill``: with ``--distill``, the KL divergence
  from the unpruned model, whose forward pass both sides then run).

Prints seconds per step of each, then

    heal_ratio: 1.31  engine_s_per_step: 4.2  study_h: 2.1

(heal_ratio: transformers' time over geospec's, measured in the same run; study_h: hours for
``--units`` pruned models healed ``--steps`` steps each at geospec's rate).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import geospec
from geospec.engine.distill import Teacher
from geospec.engine.imported import import_llama
from geospec.engine.train import parameter_groups
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.prune.cut import pruned
from geospec.prune.hf_export import export_pruned
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
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
        tie_word_embeddings=True,
    )  # fmt: skip
    return hf.LlamaForCausalLM(config).eval()


def seconds_per_step(step: Callable[[int], None], warmup: int, steps: int) -> float:
    for i in range(warmup):
        step(i)
    started = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help="SmolLM2-135M's GGUF file (default: random weights)")
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--timed", type=int, default=3, help="timed steps on each side")
    parser.add_argument("--distill", action="store_true", help="KL from the unpruned model")
    parser.add_argument("--units", type=int, default=4, help="pruned models in the study")
    parser.add_argument("--steps", type=int, default=200, help="healing steps per model")
    args = parser.parse_args()

    reference = model_of(args.gguf)
    vocab = reference.get_input_embeddings().num_embeddings
    rng = np.random.default_rng(0)
    count = args.warmup + args.timed
    ids = torch.as_tensor(rng.integers(0, vocab, (count, args.batch_size, args.seq_len + 1)))
    sites = find_ffn_sites(reference, 576, lambda: logits_of(reference, ids[0, :1, :-1]))
    n, width = len(sites), 1536
    dims = pruned_dims(n, 576, width, 64, args.keep, "swiglu")
    middle = (dims.budget - 2 * width) // (n - 2) // 64 * 64
    widths = [width] + [middle] * (n - 2) + [width]
    widths[1] += dims.budget - sum(widths)  # the budget exactly, in multiples of 64
    orders = [list(range(width))] * n  # which neurons stay does not change the step's cost
    teacher_hf = reference if args.distill else None
    with tempfile.TemporaryDirectory() as directory:
        with torch.no_grad(), pruned(sites, orders, widths):
            export_pruned(reference, sites, widths, Path(directory))
        student_hf = geospec.load_pruned(directory).float().train()
    student = import_llama(student_hf, args.seq_len).train()
    teacher = None
    if args.distill:
        teacher = Teacher(import_llama(reference, args.seq_len), "unpruned", 1.0)
    print(
        f"{args.gguf or 'random weights, SmolLM2 shape'}: keep {args.keep} ({sum(widths)} of "
        f"{n * width} neurons), {args.batch_size} x {args.seq_len} tokens a step, "
        f"{'KL from the unpruned model' if args.distill else 'next-token loss'}; "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )

    hf_optimizer = torch.optim.AdamW(parameter_groups(student_hf, 0.0), lr=1e-5)

    def hf_step(i: int) -> None:
        x = ids[i, :, :-1]
        if teacher_hf is None:  # transformers shifts the labels itself
            loss = student_hf(input_ids=x, labels=x).loss
        else:
            with torch.no_grad():
                target = teacher_hf(input_ids=x).logits
            logits = student_hf(input_ids=x).logits
            loss = F.kl_div(
                F.log_softmax(logits.float().flatten(0, 1), -1),
                F.log_softmax(target.float().flatten(0, 1), -1),
                log_target=True, reduction="batchmean",
            )  # fmt: skip
        loss.backward()
        hf_optimizer.step()
        hf_optimizer.zero_grad(set_to_none=True)

    optimizer = torch.optim.AdamW(parameter_groups(student, 0.0), lr=1e-5)

    def engine_step(i: int) -> None:
        x, y = ids[i, :, :-1], ids[i, :, 1:]
        logits, loss = student(x, y)
        assert loss is not None
        if teacher is not None:
            loss = teacher.loss(x, logits, loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    hf_s = seconds_per_step(hf_step, args.warmup, args.timed)
    print(f"transformers: {hf_s:.2f} s per step", flush=True)
    engine_s = seconds_per_step(engine_step, args.warmup, args.timed)
    print(f"geospec: {engine_s:.2f} s per step", flush=True)
    study_h = args.units * args.steps * engine_s / 3600
    print(
        f"heal_ratio: {hf_s / engine_s:.2f}  engine_s_per_step: {engine_s:.2f}  "
        f"study_h: {study_h:.2f}"
    )


if __name__ == "__main__":
    main()
