"""GPU check of the training engine: CUDA, bf16, torch.compile, throughput, MFU, end to end.

Run it as prepared, in one go: ``bash benchmarks/gpu_check.sh`` (it installs the carried wheels the
device image lacks, installs geospec without dependencies, goes offline and runs this script
within 8 minutes). Every section prints its figures as soon as it has them, and one that fails
prints its traceback and lets the next one run.

1. throughput of the spec's model (specs/121m.toml) with its uniform widths and with the cosine
   taper 1.5 -> 0.5 of the same budget (the spec's cosine arm): compiled as a one-process or DDP
   run compiles it (the whole model), bf16 autocast, fused AdamW, clipping, the spec's
   micro-batch at its seq_len, random tokens. Compile time (the first step) is reported apart;
   then ``--rounds`` rounds of ``--steps`` timed steps alternate the two models (50 timed steps
   each by default), and the steady state is the last round (the median beside it).
   MFU = 6 N tokens/s / peak (N = all parameters; 6N + 12 L d T per token with attention), peak
   989e12 bf16 dense FLOP/s (H100/H200 SXM; ``--peak-tflops``). A recompile while timing, or
   Dynamo's recompile limit, is an error, never a silently eager model;
2. the engine end to end: ``train_model`` on the bundled Shakespeare (GPT-2 tokenizer, read
   without ``datasets``) with the spec's model for ``--engine-steps`` steps (compile, bf16, the
   pinned input path, fused AdamW, evaluation, checkpoints, result.json), its steady tokens/s and
   MFU from the last logged interval and the compile time apart; then a finished-run call that
   must not retrain, and ``load_model``.

    python benchmarks/gpu_check.py [--rounds 5] [--steps 10] [--engine-steps 30] [--json F]
    python benchmarks/gpu_check.py --cpu-smoke   # the same code on CPU: small shape, eager backend

Needs no ``geospec_plugins`` and no ``datasets`` (the spec's [model] and [train] tables are read
directly), so it also runs from a source tree. Ends with one line: ``gpu_check: uniform X tok/s
(mfu_6n Y%) tapered X tok/s (mfu_6n Y%) tapered/uniform R compile S s engine ok|FAILED``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from geospec.engine.checkpoint import load_model
from geospec.engine.compiling import BACKEND_ENV, compile_backend, recompile_limit
from geospec.engine.model import GPT, GPTConfig, config_from_spec
from geospec.engine.token_data import prepare_data
from geospec.engine.train import parameter_groups, train_model, use_fused_adamw
from geospec.kinds import round_to_budget
from geospec.spec.sections import DataSpec, ModelSpec, TrainSpec

ROOT = Path(__file__).resolve().parents[1]
#: --cpu-smoke: a small model of the spec's kind, so the same code runs in seconds on a CPU
SMOKE_MODEL = {"n_layers": 4, "d_model": 64, "n_heads": 4, "ffn_width": 256, "seq_len": 64,
               "multiple_of": 16, "vocab_size": None}  # fmt: skip
SMOKE_MICRO = 4
SMOKE_VOCAB = 512  # random tokens of the throughput section (the engine's come from GPT-2's BPE)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "specs" / "121m.toml")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per model")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps after compiling")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--engine-steps", type=int, default=None, help="30 (--cpu-smoke: 6)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="run on CPU with a small model (backend eager unless $GEOSPEC_COMPILE_BACKEND)",
    )
    args = parser.parse_args()
    if args.engine_steps is None:
        args.engine_steps = 6 if args.cpu_smoke else 30
    if min(args.rounds, args.steps, args.engine_steps) < 1 or args.warmup < 0:
        parser.error("--rounds, --steps and --engine-steps must be >= 1, --warmup >= 0")
    return args


def spec_sections(path: Path, smoke: bool) -> tuple[ModelSpec, TrainSpec]:
    """The spec's [model] and [train] tables (no plugin registry, no data section needed)."""
    import tomllib

    tables = tomllib.loads(path.read_text())
    model = ModelSpec.model_validate({**tables["model"], **(SMOKE_MODEL if smoke else {})})
    train = TrainSpec.model_validate(tables["train"])
    return model, train


def cosine_widths(model: ModelSpec, start: float = 1.5, end: float = 0.5) -> list[int]:
    """The cosine taper of the same budget (geospec_plugins.schedules.Cosine, inlined)."""
    layers, uniform = model.n_layers, model.ffn_width
    raw = [
        end * uniform + (start - end) * uniform * (1 + math.cos(math.pi * i / (layers - 1))) / 2
        for i in range(layers)
    ]
    scale = layers * uniform / sum(raw)
    return round_to_budget([w * scale for w in raw], layers * uniform, model.multiple_of)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kilobytes = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * kilobytes / 2**30


def flops_per_token(config: GPTConfig) -> tuple[float, float]:
    """(6 N, 6 N + 12 L d T): training FLOPs per token without and with attention."""
    n = config.num_params()
    return 6.0 * n, 6.0 * n + 12.0 * config.n_layers * config.d_model * config.seq_len


class Trainer:
    """One compiled model, its fused AdamW and a fixed batch of random tokens."""

    def __init__(self, config: GPTConfig, micro: int, device: torch.device) -> None:
        torch.manual_seed(0)
        self.device, self.config = device, config
        self.model = GPT(config).to(device).train()
        self.model.compile(backend=compile_backend())  # whole model, as one process or DDP
        self.optimizer = torch.optim.AdamW(
            parameter_groups(self.model, 0.1),
            lr=3e-4,
            betas=(0.9, 0.95),
            fused=use_fused_adamw(device, fsdp=False) or None,
        )
        tokens = torch.randint(0, config.vocab_size, (micro, config.seq_len + 1), device=device)
        self.x, self.y = tokens[:, :-1], tokens[:, 1:]
        self.tokens_per_step = micro * config.seq_len

    def step(self) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            _, loss = self.model(self.x, self.y)
        assert loss is not None
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed(self, steps: int) -> float:
        """Seconds for ``steps`` steps, the device drained before and after."""
        synchronize(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        synchronize(self.device)
        return time.perf_counter() - start


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def throughput(
    model: ModelSpec, micro: int, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    vocab = SMOKE_VOCAB if args.cpu_smoke else model.vocab_size or 50304
    widths = {"uniform": [model.ffn_width] * model.n_layers, "tapered": cosine_widths(model)}
    print(f"  tapered widths: {' '.join(map(str, widths['tapered']))}")
    import torch._dynamo

    torch._dynamo.reset()  # only this section's graphs count against the limit below
    out: dict[str, Any] = {"widths": widths, "micro_batch": micro}
    trainers: dict[str, Trainer] = {}
    # two live models, each compiled whole: two versions of GPT.forward; a third is an error
    with recompile_limit(4):
        for name in widths:
            trainers[name] = Trainer(config_from_spec(model, widths[name], vocab), micro, device)
            compile_s = trainers[name].timed(1)
            trainers[name].timed(args.warmup)
            out[f"{name}_compile_s"] = compile_s
            print(f"  {name}: compile + first step {compile_s:.1f} s")
        graphs = compiled_graphs()
        speeds: dict[str, list[float]] = {name: [] for name in trainers}
        for index in range(args.rounds):
            order = list(trainers.items())
            if index % 2:  # alternate the order too: neither model always runs first
                order.reverse()
            for name, trainer in order:
                seconds = trainer.timed(args.steps)
                speeds[name].append(args.steps * trainer.tokens_per_step / seconds)
        if compiled_graphs() != graphs:
            raise RuntimeError("torch.compile recompiled while timing: the figures mix in compiles")
    peak = args.peak_tflops * 1e12
    for name, values in speeds.items():
        f6n, fattn = flops_per_token(trainers[name].config)
        steady = values[-1]  # the last interval: long past compilation and warm-up
        out[name] = {
            "tokens_per_s": steady,
            "tokens_per_s_median": statistics.median(values),
            "tokens_per_s_rounds": values,
            "timed_steps": args.rounds * args.steps,
            "mfu_6n": f6n * steady / peak,
            "mfu_attn": fattn * steady / peak,
            "params": trainers[name].config.num_params(),
        }
        print(
            f"  {name}: {steady:,.0f} tokens/s (last round; median {statistics.median(values):,.0f}"
            f", {args.rounds} x {args.steps} steps), MFU {100 * f6n * steady / peak:.1f}% (6N), "
            f"{100 * fattn * steady / peak:.1f}% (6N + attention)"
        )
    out["tapered_over_uniform"] = out["tapered"]["tokens_per_s"] / out["uniform"]["tokens_per_s"]
    out["peak_memory_gib"] = peak_memory_gib(device)
    print(f"  tapered/uniform {out['tapered_over_uniform']:.3f}")
    print(f"  peak memory: {out['peak_memory_gib']:.1f} GiB")
    return out


def engine_check(
    model: ModelSpec, spec_train: TrainSpec, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """train_model through every engine path; figures from its own metrics."""
    steps = args.engine_steps
    micro = SMOKE_MICRO if args.cpu_smoke else 32
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        data = prepare_data(
            DataSpec(source="bundled:shakespeare", tokenizer={"kind": "gpt2"}), Path(tmp) / "data"
        )
        print(f"  tokenized Shakespeare: {len(data.train):,} training tokens in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        config = config_from_spec(model, [model.ffn_width] * model.n_layers, data.vocab_size)
        interval = max(1, min(5, steps // 3))  # at least three intervals when steps allow
        half = max(1, steps // 2)  # validated below: 0 would divide by zero in the loop
        settings = {"tokens": None, "steps": steps, "batch_size": 2 * micro,
                    "micro_batch_size": micro, "warmup": min(5, steps), "eval_interval": half,
                    "eval_tokens": 16 * micro * config.seq_len, "checkpoint_interval": half,
                    "log_interval": interval, "device": device.type, "compile": True}  # fmt: skip
        train = TrainSpec.model_validate({**spec_train.model_dump(), **settings})
        out_dir = Path(tmp) / "run"
        started = time.perf_counter()
        result = train_model(train, config, data, out_dir, seed=0, progress=True)
        print(f"  trained {steps} steps in {time.perf_counter() - started:.1f} s: {result}")
        assert math.isfinite(result.final_val_loss), result
        rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
        logged = [row for row in rows if "tokens_per_s" in row]
        assert logged and any("val_loss" in row for row in rows), rows
        # each logged interval: (steps, seconds); the last is the steady state, and the first
        # minus its steps at the steady pace is the compile time (one interval: not separable)
        tokens_per_step = train.batch_size * config.seq_len
        intervals = [
            (row["step"] - before, (row["step"] - before) * tokens_per_step / row["tokens_per_s"])
            for before, row in zip([0] + [r["step"] for r in logged], logged, strict=False)
        ]
        steady = logged[-1]["tokens_per_s"]
        steady_step = intervals[-1][1] / intervals[-1][0]
        compile_s = intervals[0][1] - intervals[0][0] * steady_step if len(logged) > 1 else None
        f6n, fattn = flops_per_token(config)
        peak = args.peak_tflops * 1e12
        compiled = "not separable (one interval)" if compile_s is None else f"{compile_s:.1f} s"
        print(
            f"  steady state (last interval): {steady:,.0f} tokens/s, MFU "
            f"{100 * f6n * steady / peak:.1f}% (6N); compile and first steps: {compiled}"
        )
        again = train_model(train, config, data, out_dir, seed=0, progress=False)
        assert again == result, "a finished run must not be retrained"
        loaded = load_model(out_dir, device=device)
        assert loaded.num_params() == config.num_params()
        return {
            "steps": steps,
            "final_val_loss": result.final_val_loss,
            "tokens_per_s_steady": steady,
            "mfu_6n_steady": f6n * steady / peak,
            "mfu_attn_steady": fattn * steady / peak,
            "compile_s": compile_s,
            "train_seconds": result.train_seconds,
            "peak_memory_gib": peak_memory_gib(device),
        }


def section(name: str, work: Callable[[], dict[str, Any]], report: dict[str, Any]) -> None:
    print(name, flush=True)
    try:
        report[name] = work()
    except Exception:  # report it, and let the next section use the machine
        traceback.print_exc()
        report[name] = {"error": traceback.format_exc(limit=3)}
    print(flush=True)


def main() -> None:
    args = parse()
    if args.cpu_smoke:
        os.environ.setdefault(BACKEND_ENV, "eager")
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        sys.exit("gpu_check: no CUDA device; run it on a GPU machine, or pass --cpu-smoke")
    model, spec_train = spec_sections(args.spec, args.cpu_smoke)
    micro = SMOKE_MICRO if args.cpu_smoke else spec_train.micro_batch_size or 16
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke run)"
    print(f"device: {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"compile backend {compile_backend()}")  # fmt: skip
    print(f"peak assumed: {args.peak_tflops:g} TFLOP/s bf16 dense (--peak-tflops)")
    print(f"model: {args.spec.name} shape {model.n_layers} x {model.d_model}, FFN "
          f"{model.ffn_width}, seq_len {model.seq_len}, micro-batch {micro}\n")  # fmt: skip
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    report: dict[str, Any] = {"device": name, "torch": torch.__version__, "smoke": args.cpu_smoke}
    section("throughput", lambda: throughput(model, micro, args, device), report)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    section("engine", lambda: engine_check(model, spec_train, args, device), report)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    failed = [key for key in ("throughput", "engine") if "error" in report[key]]
    speed = report["throughput"]
    if "error" in speed:
        summary = "throughput FAILED"
    else:
        u, t = speed["uniform"], speed["tapered"]
        summary = (
            f"uniform {u['tokens_per_s']:,.0f} tok/s (mfu_6n {100 * u['mfu_6n']:.1f}%) "
            f"tapered {t['tokens_per_s']:,.0f} tok/s (mfu_6n {100 * t['mfu_6n']:.1f}%) "
            f"tapered/uniform {speed['tapered_over_uniform']:.2f} "
            f"compile {speed['uniform_compile_s']:.0f} s"
        )
    print(f"gpu_check: {summary} engine {'FAILED' if 'engine' in failed else 'ok'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
