"""Benchmark: the demand measurement from the cut layer on against one full pass per cut.

On SmolLM2-135M (its GGUF, ``--gguf PATH``, de-quantised by transformers: the gguf extra), or
without it on a Llama model of SmolLM2's shape with random weights (30 layers, width 576, 9 query
and 3 key/value heads, SwiGLU FFN 1536, vocabulary 49152), it measures the loss increase of every
layer cut to each keep fraction (magnitude ordering) and of ``--pairs`` pairs, on the same
windows twice:

- old: :func:`geospec.measure.demand.demand_full_passes`, one full forward pass per cut
  (1 + L x F + P passes), the reference implementation;
- new: :func:`geospec.measure.demand.measure_demand`, each cut run from the cut layer on (what
  the demand stage runs).

Prints both wall and CPU times (on a shared machine the CPU-time ratio is the steadier figure),
the largest absolute difference of any number, and ends with

    speedup: 1.9  max_abs_diff: 0  new_s: 123

``--skip-old`` times the new path alone (the whole measurement at the demand stage's settings:
``--windows 8 --seq-len 256 --batch-size 4 --pairs 16``, the goal being under 10 minutes on 2
cores). The default (2 windows of 128 tokens) takes a few minutes, most of it the old path.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers as hf

from geospec.measure.cut import neuron_order, neuron_weights
from geospec.measure.demand import CutPlan, demand_full_passes, measure_demand
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of, sample_pairs
from geospec.plugin import create_plugin


def model_of(args: argparse.Namespace) -> torch.nn.Module:
    if args.gguf:
        path = str(args.gguf)
        return hf.AutoModelForCausalLM.from_pretrained(
            path.rsplit("/", 1)[0], gguf_file=path.rsplit("/", 1)[1], dtype=torch.float32
        ).eval()
    torch.manual_seed(args.seed)
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


def numbers(demand: object) -> list[float]:
    return [
        demand.base,  # type: ignore[attr-defined]
        *(v for row in demand.increase for v in row),  # type: ignore[attr-defined]
        *(p.joint for p in demand.pairs),  # type: ignore[attr-defined]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help="SmolLM2-135M's GGUF file (default: random weights)")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--keep", type=float, nargs="+", default=[0.75, 0.5, 0.25, 0.125])
    parser.add_argument("--multiple", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-old", action="store_true", help="time the new path only")
    args = parser.parse_args()

    model = model_of(args)
    vocab = model.get_input_embeddings().num_embeddings
    width = model.get_input_embeddings().embedding_dim
    generator = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, vocab, (args.windows, args.seq_len + 1), generator=generator)
    batches = [
        (tokens[i : i + args.batch_size, :-1], tokens[i : i + args.batch_size, 1:])
        for i in range(0, args.windows, args.batch_size)
    ]
    sites = find_ffn_sites(model, width, lambda: logits_of(model, batches[0][0][:1]))
    importance = create_plugin("importance", {"kind": "magnitude"})
    orders = [neuron_order(importance, neuron_weights(s.ffn, i)) for i, s in enumerate(sites)]
    pairs = sample_pairs(len(sites), args.pairs, args.seed)
    plan = CutPlan.of(orders, args.keep, args.multiple, pairs, args.keep[1])
    source = args.gguf or "random weights, SmolLM2's shape"
    print(
        f"{source}: {len(sites)} layers; {args.windows} windows of {args.seq_len} tokens in "
        f"batches of {args.batch_size}; {len(args.keep)} fractions, {len(pairs)} pairs; "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )

    started, cpu = time.perf_counter(), time.process_time()
    new = measure_demand(model, sites, batches, plan)
    new_s, new_cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"new (from the cut layer on): {new_s:.1f} s, {new_cpu:.1f} s of CPU", flush=True)
    if new.fallback is not None:
        print(f"  fell back to full forward passes: {new.fallback}")
    if args.skip_old:
        print(f"speedup: -  max_abs_diff: -  new_s: {new_s:.0f}")
        return

    started, cpu = time.perf_counter(), time.process_time()
    old = demand_full_passes(model, sites, batches, plan)
    old_s, old_cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"old (full forward passes): {old_s:.1f} s, {old_cpu:.1f} s of CPU", flush=True)
    diff = max(abs(a - b) for a, b in zip(numbers(old), numbers(new), strict=True))
    print(f"CPU time ratio (less disturbed by other processes): {old_cpu / new_cpu:.2f}")
    print(f"speedup: {old_s / new_s:.2f}  max_abs_diff: {diff:.3g}  new_s: {new_s:.0f}")


if __name__ == "__main__":
    main()
