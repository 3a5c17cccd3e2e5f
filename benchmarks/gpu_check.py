"""GPU check of the training engine: CUDA, bf16 autocast, torch.compile, throughput and MFU.

One short script (a few minutes on one H100/H200) for a machine with a GPU:

1. throughput of the 121m spec's model (specs/121m.toml) with its uniform widths and with the
   cosine taper of the same budget: compiled, bf16 autocast, fused AdamW, gradient clipping, the
   spec's micro-batch at seq_len 1024, random tokens; tokens/s and model FLOP utilisation
   MFU = 6 * N * tokens/s / peak (N = all parameters; the variant with attention FLOPs,
   6N + 12 * L * d * T per token, is printed beside it), peak 989e12 bf16 dense FLOP/s (H100/H200
   SXM; pass --peak-tflops for other GPUs);
2. the engine end to end on CUDA: train_model on the bundled Shakespeare with the GPT-2 tokenizer
   and the 121m model for a few steps (compile, bf16, checkpoint, evaluation, result.json),
   then load_model and a finished-run call that must not retrain.

    python benchmarks/gpu_check.py [--steps 20] [--peak-tflops 989]

Ends with one line: ``gpu_check: tokens/s X  mfu_6n Y%  mfu_attn Z%  tapered/uniform R  engine ok``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from geospec_plugins.schedules import Cosine

from geospec.engine.checkpoint import load_model
from geospec.engine.model import GPT, GPTConfig, config_from_spec
from geospec.engine.token_data import prepare_data
from geospec.engine.train import parameter_groups, train_model
from geospec.spec.loading import load_spec
from geospec.spec.resolve import model_dims
from geospec.spec.sections import DataSpec

ROOT = Path(__file__).resolve().parents[1]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "specs" / "121m.toml")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per model")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps (compilation)")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--engine-steps", type=int, default=30)
    return parser.parse_args()


def throughput(config: GPTConfig, micro: int, args: argparse.Namespace) -> float:
    """Training tokens/s of a compiled model in bf16 autocast with fused AdamW."""
    torch.manual_seed(0)
    model = GPT(config).cuda().train()
    model.compile()
    optimizer = torch.optim.AdamW(
        parameter_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95), fused=True
    )
    seq_len = model.config.seq_len
    tokens = torch.randint(0, 50257, (micro, seq_len + 1), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        assert loss is not None
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    started = time.perf_counter()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    print(f"    compile + {args.warmup} warm-up steps: {time.perf_counter() - started:.1f} s")
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    return args.steps * micro * seq_len / (time.perf_counter() - start)


def engine_check(spec_path: Path, steps: int, device: str = "cuda") -> float:
    """train_model on CUDA through every engine path; returns the final validation loss."""
    spec = load_spec(spec_path)
    with tempfile.TemporaryDirectory() as tmp:
        data = prepare_data(
            DataSpec(source="bundled:shakespeare", tokenizer={"kind": "gpt2"}), Path(tmp) / "data"
        )
        widths = [spec.model.ffn_width] * spec.model.n_layers
        config = config_from_spec(spec.model, widths, data.vocab_size)
        train = spec.train.model_copy(
            update={"tokens": None, "steps": steps, "batch_size": 64, "micro_batch_size": 32,
                    "warmup": 5, "eval_interval": steps // 2, "eval_tokens": 65536,
                    "checkpoint_interval": steps // 2, "log_interval": 5}
        )  # fmt: skip
        out = Path(tmp) / "run"
        started = time.perf_counter()
        result = train_model(train, config, data, out, seed=0, progress=True)
        print(f"    trained {steps} steps in {time.perf_counter() - started:.1f} s: {result}")
        assert torch.isfinite(torch.tensor(result.final_val_loss))
        metrics = (out / "metrics.jsonl").read_text().splitlines()
        assert len(metrics) >= 3, metrics
        again = train_model(train, config, data, out, seed=0, progress=False)
        assert again == result, "a finished run must not be retrained"
        model = load_model(out, device=device)
        assert model.num_params() == config.num_params()
        return result.final_val_loss


def main() -> None:
    args = parse()
    if not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device; run this on a machine with a GPU")
    spec = load_spec(args.spec)
    name = torch.cuda.get_device_name()
    print(f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"peak assumed: {args.peak_tflops:g} TFLOP/s bf16 dense (H100/H200 SXM; --peak-tflops)")
    torch.backends.cuda.matmul.allow_tf32 = True
    m = spec.model
    micro = spec.train.micro_batch_size or 16
    uniform = config_from_spec(m, [m.ffn_width] * m.n_layers, 50257)
    tapered_widths = Cosine(Cosine.Params(start=1.5, end=0.5)).widths(model_dims(spec.model), {})
    tapered = config_from_spec(m, tapered_widths, 50257)
    n = uniform.num_params()
    print(f"model: {args.spec.name}, {n:,} parameters, micro-batch {micro} x {m.seq_len} tokens")
    print("  uniform")
    uniform_speed = throughput(uniform, micro, args)
    print("  tapered", " ".join(map(str, tapered_widths)))
    torch.cuda.empty_cache()  # the uniform model is gone: give its memory back
    tapered_speed = throughput(tapered, micro, args)
    peak = args.peak_tflops * 1e12
    mfu = 6 * n * uniform_speed / peak
    attention = 12 * m.n_layers * m.d_model * m.seq_len
    mfu_attention = (6 * n + attention) * uniform_speed / peak
    print(f"  uniform {uniform_speed:,.0f} tokens/s, tapered {tapered_speed:,.0f} tokens/s")
    print(f"  MFU: {100 * mfu:.1f}% (6N), {100 * mfu_attention:.1f}% (6N + attention)")
    print(f"  peak CUDA memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    print("engine end to end on CUDA")
    loss = engine_check(args.spec, args.engine_steps)
    print(f"  final validation loss {loss:.4f}")
    ratio = tapered_speed / uniform_speed
    print(
        f"gpu_check: tokens/s {uniform_speed:,.0f}  mfu_6n {100 * mfu:.1f}%  mfu_attn "
        f"{100 * mfu_attention:.1f}%  tapered/uniform {ratio:.2f}  engine ok"
    )


if __name__ == "__main__":
    main()
