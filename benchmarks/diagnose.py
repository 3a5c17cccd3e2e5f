"""Benchmark: the diagnose stage's perturbations from the perturbed layer on against full passes.

Builds a Llama-architecture model from a config with random weights, by default SmolLM2-135M's
shape (30 layers, width 576, 9 query and 3 key/value heads, SwiGLU FFN 1536, vocabulary 49152,
tied embeddings), and computes the layer sensitivities (every FFN scaled by 1 - eps and removed)
and the additivity of ``--pairs`` layer pairs on the same validation windows twice:

- old: :func:`geospec.measure.sensitivity.layer_sensitivity` and ``additivity``, one full forward
  pass per perturbation (1 + 2 L + P passes), the reference implementation;
- new: :func:`geospec.measure.suffix.perturb_layers`, each perturbation run from the layer after
  the perturbed one (what the diagnose stage runs).

Prints both wall times and CPU times (on a shared machine the CPU time ratio is the steadier
figure), the largest absolute difference of any number (base loss, sensitivities,
joint pair changes), what a count of multiply-adds predicts, and ends with

    speedup: 1.9  max_abs_diff: 0

The default (2 windows of 128 tokens) takes a few minutes on 2 cores, most of it the old path;
``--windows 16 --seq-len 256 --batch-size 4`` is the diagnose stage's default work on SmolLM2.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers as hf

from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import additivity, layer_sensitivity, logits_of, sample_pairs
from geospec.measure.suffix import perturb_layers


def smollm2_like(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    config = hf.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(2048, args.seq_len),
        tie_word_embeddings=True,
    )
    return hf.LlamaForCausalLM(config).eval()


def predicted_speedup(
    args: argparse.Namespace, pairs: list[tuple[int, int]]
) -> tuple[float, float]:
    """Multiply-adds per token of a full pass against the new path's, in layer equivalents, and
    the output head's cost in layers (attention scores at the mean causal length included)."""
    d, kv = args.d_model, args.d_model // args.heads * args.kv_heads
    layer = d * (2 * d + 2 * kv) + 3 * d * args.ffn + 2 * d * (args.seq_len + 1) / 2
    head = d * args.vocab / layer
    n = args.layers
    full = n + head
    old = (1 + 2 * n + len(pairs)) * full
    new = full + sum(2 * (n - 1 - i + head) for i in range(n))
    new += sum(n - 1 - j + head for _, j in pairs)
    new += 2 * full / args.windows  # the exactness check: a full pass and a walk of one window
    return old / new, head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--d-model", type=int, default=576)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--ffn", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--eps", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    model = smollm2_like(args)
    generator = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, args.vocab, (args.windows, args.seq_len + 1), generator=generator)
    batches = [
        (tokens[i : i + args.batch_size, :-1], tokens[i : i + args.batch_size, 1:])
        for i in range(0, args.windows, args.batch_size)
    ]
    sites = find_ffn_sites(model, args.d_model, lambda: logits_of(model, batches[0][0][:1]))
    pairs = sample_pairs(len(sites), args.pairs, args.seed)
    print(
        f"{args.layers} layers, width {args.d_model}, vocabulary {args.vocab}; "
        f"{args.windows} windows of {args.seq_len} tokens in batches of {args.batch_size}; "
        f"{len(pairs)} pairs; {torch.get_num_threads()} threads",
        flush=True,
    )

    started, cpu = time.perf_counter(), time.process_time()
    new = perturb_layers(model, sites, batches, args.eps, pairs)
    new_s, new_cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"new (from the perturbed layer on): {new_s:.1f} s, {new_cpu:.1f} s of CPU", flush=True)
    if new.fallback is not None:
        print(f"  fell back to full forward passes: {new.fallback}")

    started, cpu = time.perf_counter(), time.process_time()
    single = layer_sensitivity(model, sites, batches, args.eps)
    joint = additivity(model, sites, batches, single, pairs)
    old_s, old_cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"old (full forward passes): {old_s:.1f} s, {old_cpu:.1f} s of CPU", flush=True)

    old_numbers = [single.base, *single.scale, *single.remove, *(p.joint for p in joint.pairs)]
    new_numbers = [
        new.sensitivity.base,
        *new.sensitivity.scale,
        *new.sensitivity.remove,
        *(p.joint for p in new.additivity.pairs),
    ]
    diff = max(abs(a - b) for a, b in zip(old_numbers, new_numbers, strict=True))
    predicted, head = predicted_speedup(args, pairs)
    print(
        f"multiply-add count: the output head costs {head:.1f} layers; predicted speedup "
        f"{predicted:.2f} (with a free head: "
        f"{predicted_speedup(argparse.Namespace(**{**vars(args), 'vocab': 0}), pairs)[0]:.2f})"
    )
    print(f"CPU time ratio (less disturbed by other processes): {old_cpu / new_cpu:.2f}")
    print(f"speedup: {old_s / new_s:.2f}  max_abs_diff: {diff:.3g}")


if __name__ == "__main__":
    main()
