"""Training throughput: geospec's GPT against Hugging Face GPT-2, and tapered against uniform.

Three models of the same shape are trained on the same random tokens with the same AdamW, in
alternating rounds (so machine noise hits all of them alike):

- geospec uniform: every FFN of width ``ffn``;
- HF: ``transformers.GPT2LMHeadModel`` with the same layers, width, heads, FFN width (n_inner),
  vocabulary, sequence length and batch (tanh gelu, tied embeddings, no dropout);
- geospec tapered: the cosine taper 1.5 -> 0.5 of the same FFN budget (rounded to 64).

Prints tokens/s of each (best and median round), the ratios and the peak resident memory, and ends
with one summary line ``geospec/HF: X  tapered/uniform: Y  peak_rss_mb: Z`` that other tools read.

    python benchmarks/train_throughput.py            # CPU, about a minute
    python benchmarks/train_throughput.py --device cuda --layers 12 --d-model 768 --seq-len 1024
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable

import torch
from geospec_plugins.schedules import Cosine

from geospec.engine.model import GPT, GPTConfig
from geospec.engine.train import parameter_groups
from geospec.kinds import ModelDims

Step = Callable[[], None]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024, help="uniform FFN width")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per model per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    return parser.parse_args()


def tapered_widths(args: argparse.Namespace) -> list[int]:
    dims = ModelDims(args.layers, args.d_model, args.ffn, 64)
    return Cosine(Cosine.Params(start=1.5, end=0.5)).widths(dims, {})


def geospec_step(
    args: argparse.Namespace, widths: list[int], tokens: torch.Tensor
) -> tuple[Step, int]:
    config = GPTConfig(
        vocab_size=args.vocab,
        n_layers=args.layers,
        d_model=args.d_model,
        n_heads=args.heads,
        seq_len=args.seq_len,
        ffn_widths=widths,
    )
    model = GPT(config).to(args.device).train()
    optimizer = torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.95))
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        _, loss = model(x, y)
        assert loss is not None
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model.num_params()


def hf_step(args: argparse.Namespace, tokens: torch.Tensor) -> tuple[Step, int]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=args.vocab,
        n_positions=args.seq_len,
        n_embd=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
        n_inner=args.ffn,
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).to(args.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    x = tokens[:, :-1]  # HF shifts labels itself: the same seq_len tokens are predicted

    def step() -> None:
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, sum(p.numel() for p in model.parameters())


def timed(step: Step, steps: int, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    args = parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), device=args.device)
    tapered = tapered_widths(args)
    runs = {
        "geospec uniform": geospec_step(args, [args.ffn] * args.layers, tokens),
        "HF GPT2LMHeadModel": hf_step(args, tokens),
        "geospec tapered": geospec_step(args, tapered, tokens),
    }
    print(
        f"shape: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, FFN "
        f"{args.ffn}, vocab {args.vocab}, seq_len {args.seq_len}, batch {args.batch}, "
        f"device {args.device}, {torch.get_num_threads()} threads"
    )
    print(f"tapered widths: {' '.join(map(str, tapered))}")
    for name, (_, params) in runs.items():
        print(f"  {name:<20} {params:>12,} parameters")
    for step, _ in runs.values():
        timed(step, args.warmup, args.device)
    speeds: dict[str, list[float]] = {name: [] for name in runs}
    tokens_per_round = args.steps * args.batch * args.seq_len
    for round_index in range(args.rounds):
        order = list(runs.items())
        if round_index % 2:  # alternate the order too: no model always runs first
            order.reverse()
        for name, (step, _) in order:
            speeds[name].append(tokens_per_round / timed(step, args.steps, args.device))
    # Other processes can only slow a round down, so the fastest round is the best estimate of
    # each model's own speed (as timeit takes the minimum); the median is shown beside it.
    best = {name: max(values) for name, values in speeds.items()}
    for name, values in speeds.items():
        print(
            f"  {name:<20} {best[name]:>10,.0f} tokens/s best round, "
            f"{statistics.median(values):,.0f} median ({min(values):,.0f} slowest)"
        )
    versus_hf = best["geospec uniform"] / best["HF GPT2LMHeadModel"]
    tapered_ratio = best["geospec tapered"] / best["geospec uniform"]
    kilobytes = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kilobytes / 2**20
    if args.device.startswith("cuda"):
        print(f"  peak CUDA memory: {torch.cuda.max_memory_allocated() / 2**20:,.0f} MB")
    summary = f"geospec/HF: {versus_hf:.2f}  tapered/uniform: {tapered_ratio:.2f}"
    print(f"{summary}  peak_rss_mb: {peak_mb:.0f}")


if __name__ == "__main__":
    main()
