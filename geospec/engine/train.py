"""Training one model: AdamW, warmup + cosine decay, accumulation, clipping, exact resume.

:func:`train_model` trains ``config`` on ``data`` into ``out_dir`` (see
:mod:`geospec.engine.checkpoint` for the files). Started again on the same directory it continues
from the last checkpoint and ends with the same final validation loss as an uninterrupted run (bit-
identical on CPU); on a finished directory it returns the stored result without training. Under
torchrun every process calls it; the global batch is ``train.batch_size`` whatever the number of
processes, and only rank 0 writes files and reports progress.

Each step reads the sequences ``step * batch .. (step + 1) * batch - 1`` of the seed's data order
(:mod:`geospec.engine.batches`); rank r takes its contiguous share of them, cut into
micro-batches.

SIGTERM or SIGUSR1 (a scheduler's warning before preemption or the time limit) stops a run at the
end of its current step: it writes a checkpoint of that step and raises
:class:`geospec.errors.Preempted`, whose exit status (75, ``REQUEUE_EXIT_CODE``) asks for a
requeue; started again, it resumes to the result an uninterrupted run has. Under torchrun the
processes also stop so, at the next log interval, when their launcher is gone: torchrun starts
its workers in sessions of their own, so a launcher killed outright (SIGKILL, the out-of-memory
killer) would leave them training on unwatched, holding the run's claim, where one failing
process leaves the other waiting in a collective.

An observer (:class:`TrainObserver`; the pipeline's experiment trackers) is told on rank 0 where
the run starts, every row ``metrics.jsonl`` gets and the result; the engine knows nothing of what
it does with them."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from geospec.atomic import atomic_write_json
from geospec.engine import distributed
from geospec.engine.batches import StepBatches, TrainOrder, validation_windows, window_tensors
from geospec.engine.checkpoint import (
    DamagedCheckpoint,
    append_metrics,
    load_model,
    load_weights,
    read_checkpoint,
    truncate_metrics,
    weights_checksum,
    write_checkpoint,
    write_config,
)
from geospec.engine.compiling import compile_for_training, recompile_limit
from geospec.engine.distributed import DistContext
from geospec.engine.memory import (
    advice,
    host_available,
    memory_refusal,
    micro_batching,  # defined here before it moved: the old name stays
    says_out_of_memory,
    training_memory,
)
from geospec.engine.model import GPT, GPTConfig
from geospec.engine.model_size import Shape
from geospec.engine.progress import TrainProgress
from geospec.engine.run_files import RESULT_FILE
from geospec.engine.token_data import TokenData
from geospec.errors import GeospecError, OutOfMemory, Preempted, UsageError
from geospec.spec.sections import TrainSpec

__all__ = [
    "TrainObserver",
    "TrainResult",
    "load_model",
    "resolve_device",
    "total_steps",
    "train_model",
]


@dataclass(frozen=True)
class TrainResult:
    """What a finished run reports (``result.json``)."""

    final_val_loss: float
    steps: int
    tokens: int
    wall_seconds: float
    """Time spent in this run's training sessions, evaluation and checkpoints included."""
    train_seconds: float
    """Time spent in training steps only."""
    tokens_per_second: float
    params: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainResult:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


class TrainObserver(Protocol):
    """Watches one run on rank 0 (experiment trackers); it must not raise into training."""

    def start(self, fingerprint: dict[str, Any], step: int) -> None:
        """Training starts at ``step`` (0, or the checkpoint a resumed run continues from)."""

    def log(self, row: dict[str, Any]) -> None:
        """A row just appended to ``metrics.jsonl``."""

    def end(self, result: dict[str, Any] | None) -> None:
        """The run finished (``result.json``'s values) or stopped early (None)."""


def device_free_memory(device: torch.device) -> int | None:
    """Bytes a training process may still allocate on ``device``: CUDA's free memory, or the
    host's available memory shared among this host's processes; None where unknown (mps)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        free = host_available()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return None if free is None else free // max(local, 1)
    return None


def resolve_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """'auto' is CUDA when available (this process's GPU under torchrun), else CPU."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"train.device: {device!r} but CUDA is not available; use 'auto'")
        if resolved.index is None:
            resolved = torch.device("cuda", local_rank)
    return resolved


def total_steps(train: TrainSpec, seq_len: int, steps: int | None = None) -> int:
    """Optimizer steps of a run: ``steps``, else train.steps, else the token budget's steps."""
    if steps is not None:
        return steps
    if train.steps is not None:
        return train.steps
    assert train.tokens is not None  # the spec requires exactly one of steps and tokens
    return math.ceil(train.tokens / (train.batch_size * seq_len))


def learning_rate(train: TrainSpec, step: int, total: int) -> float:
    """Linear warmup over ``train.warmup`` steps, then cosine decay to ``min_lr_ratio * lr``."""
    if step < train.warmup:
        return train.lr * (step + 1) / train.warmup
    progress = (step - train.warmup) / max(1, total - train.warmup)
    floor = train.lr * train.min_lr_ratio
    return floor + 0.5 * (train.lr - floor) * (1.0 + math.cos(math.pi * min(1.0, progress)))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on the linear weights only (not on norms, biases or embeddings)."""
    decay: dict[int, nn.Parameter] = {}
    no_decay: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            exempt = name == "bias" or not isinstance(module, nn.Linear)
            (no_decay if exempt else decay)[id(param)] = param
    for key in no_decay:  # a tied lm_head is the embedding: no decay
        decay.pop(key, None)
    return [
        {"params": list(decay.values()), "weight_decay": weight_decay},
        {"params": list(no_decay.values()), "weight_decay": 0.0},
    ]


def use_fused_adamw(device: torch.device, fsdp: bool) -> bool:
    """Fused AdamW (one kernel for all parameters) on CUDA; under FSDP2 (DTensor parameters)
    from torch 2.5, whose DTensor rules shard the fused kernel. CPU keeps the default kernels, so
    CPU runs stay bit-identical to earlier versions."""
    release = tuple(int(part) for part in torch.__version__.split(".")[:2])
    return device.type == "cuda" and (not fsdp or release >= (2, 5))


def fingerprint(
    train: TrainSpec, config: GPTConfig, data: TokenData, seed: int, steps: int
) -> dict[str, Any]:
    """What makes two runs the same experiment (a directory refuses to mix different ones)."""
    return {
        "config": config.to_dict(),
        "data": data.key,
        "tokens": data.digests,
        "seed": seed,
        "steps": steps,
        "batch_size": train.batch_size,
        "optimizer": [
            train.lr,
            train.min_lr_ratio,
            train.warmup,
            train.weight_decay,
            list(train.betas),
            train.eps,
            train.grad_clip,
        ],
        "eval_tokens": train.eval_tokens,
    }


def execution(device: torch.device, bf16: bool, processes: int, compiled: bool) -> dict[str, Any]:
    """How this session of a run computes: not part of the experiment (its fingerprint), but what
    decides the order of floating-point sums, so the same run under another setting (CPU threads
    above all) ends at a loss that differs in the third or fourth decimal."""
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "processes": processes,
        "precision": "bf16" if bf16 else "fp32",
        "compiled": compiled,
        "torch": torch.__version__,
    }


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """A content hash of a state dict (names, shapes, dtypes and bytes)."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        h.update(tensor.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def _check_same_run(out_dir: Path, stored: dict[str, Any], wanted: dict[str, Any]) -> None:
    if "tokens" not in stored:  # recorded before geospec hashed the tokens: compare the rest
        wanted = {k: v for k, v in wanted.items() if k != "tokens"}
    if stored != wanted:
        differing = sorted(
            k for k in wanted.keys() | stored.keys() if stored.get(k) != wanted.get(k)
        )
        raise UsageError(
            f"{out_dir} holds a run with different settings ({', '.join(differing)}); delete it or "
            "train into another directory"
        )


def finished_result(out_dir: Path, wanted: dict[str, Any]) -> TrainResult | None:
    path = out_dir / RESULT_FILE
    try:
        data = json.loads(path.read_text())
        result = TrainResult.from_dict(data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # missing or damaged: the run finishes again from its last checkpoint
    _check_same_run(out_dir, data.get("fingerprint", {}), wanted)
    return result


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _seed_dropout(seed: int, rank: int) -> None:
    """Different dropout masks per process, reproducible from (seed, rank)."""
    torch.manual_seed(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]))


def _all_finite(model: nn.Module, ctx: DistContext, device: torch.device) -> bool:
    bad = torch.zeros((), device=device)
    for param in model.parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        bad += (~torch.isfinite(local.detach())).sum()
    return bool(distributed.all_reduce_sum(bad, ctx).item() == 0)


class _StateIO:
    """Full (unsharded) model and optimizer state on rank 0, whatever the parallelism."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, ctx: DistContext):
        from torch.distributed.checkpoint import state_dict as dcp

        self.dcp = dcp
        self.model, self.optimizer, self.ctx = model, optimizer, ctx
        self.save_options = dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)
        self.load_options = dcp.StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=ctx.enabled
        )

    def get(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        dcp = self.dcp
        weights = dcp.get_model_state_dict(self.model, options=self.save_options)
        optim = dcp.get_optimizer_state_dict(self.model, self.optimizer, options=self.save_options)
        return weights, optim

    def set(self, weights: dict[str, torch.Tensor], optim: dict[str, Any]) -> None:
        dcp = self.dcp
        dcp.set_model_state_dict(self.model, weights, options=self.load_options)
        dcp.set_optimizer_state_dict(self.model, self.optimizer, optim, options=self.load_options)


@contextlib.contextmanager
def _autocast(device: torch.device, bf16: bool) -> Iterator[None]:
    if bf16:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            yield
    else:
        yield


def evaluate(
    model: nn.Module,
    tokens: np.ndarray,
    windows: np.ndarray,
    seq_len: int,
    batch: int,
    device: torch.device,
    ctx: DistContext,
    bf16: bool,
) -> float:
    """Mean next-token cross-entropy over ``windows`` of ``tokens``, shared across processes.

    Every process runs the same number of forward passes (FSDP gathers weights in each), padding
    with zero-weight batches where its share runs out.
    """
    mine = windows[ctx.rank :: ctx.world_size]
    passes = math.ceil(math.ceil(len(windows) / ctx.world_size) / batch)
    total = torch.zeros(2, dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    with torch.no_grad(), _autocast(device, bf16):
        for i in range(passes):
            part = mine[i * batch : (i + 1) * batch]
            weight = 1.0 if len(part) else 0.0
            x, y = window_tensors(tokens, part if len(part) else windows[:1], seq_len)
            _, loss = model(x.to(device), y.to(device))
            assert loss is not None
            total[0] += weight * loss.double() * y.numel()
            total[1] += weight * y.numel()
    model.train(was_training)
    distributed.all_reduce_sum(total, ctx)
    return float(total[0] / total[1])


class _StopSignal:
    """Why this process stops early: the signal it received (None: none yet), or, under
    torchrun, that its launcher is gone."""

    signum: int | None = None
    orphaned: bool = False

    @property
    def received(self) -> bool:
        return self.signum is not None or self.orphaned

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    @property
    def name(self) -> str:
        if self.signal_name is not None:
            return self.signal_name
        if self.orphaned:
            return "the exit of its launcher"
        return "a stop another process received"


@contextlib.contextmanager
def _stop_signals() -> Iterator[_StopSignal]:
    """While training: SIGTERM and SIGUSR1 only mark the run to stop after its current step (the
    previous handlers come back afterwards). Outside the main thread signals stay as they are."""
    stop = _StopSignal()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def mark(signum: int, frame: Any) -> None:
        stop.signum = signum

    previous = {s: signal.signal(s, mark) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def train_model(
    train: TrainSpec,
    config: GPTConfig,
    data: TokenData,
    out_dir: Path,
    seed: int,
    steps: int | None = None,
    progress: bool = True,
    observer: TrainObserver | None = None,
    initial: dict[str, torch.Tensor] | None = None,
) -> TrainResult:
    """Train (or resume, or return the finished result of) one model; see the module docstring.
    ``observer`` watches it on rank 0 (not a finished run returned as it is). ``initial``: the
    model's starting weights (a pretrained or pruned model, fine-tuned) instead of the seeded
    initialisation; the fingerprint holds their digest, so a directory never mixes two."""
    run = _Run(train, config, data, Path(out_dir), seed, steps, progress, observer, initial)
    return run.run()


class _Run:
    """One training run's state; split into methods only to keep each step readable."""

    def __init__(
        self,
        train: TrainSpec,
        config: GPTConfig,
        data: TokenData,
        out_dir: Path,
        seed: int,
        steps: int | None,
        progress: bool,
        observer: TrainObserver | None = None,
        initial: dict[str, torch.Tensor] | None = None,
    ) -> None:
        self.train, self.config, self.data, self.out_dir, self.seed = (
            train,
            config,
            data,
            out_dir,
            seed,
        )
        self.ctx = distributed.init_distributed()
        self.device = resolve_device(train.device, self.ctx.local_rank)
        self.bf16 = train.precision == "bf16" or (
            train.precision == "auto" and self.device.type == "cuda"
        )
        self.total = total_steps(train, config.seq_len, steps)
        self.micro, self.accum = micro_batching(train, self.ctx.world_size)
        self.initial = initial
        self.fingerprint = fingerprint(train, config, data, seed, self.total)
        if initial is not None:  # absent otherwise: fingerprints of earlier runs stay equal
            self.fingerprint["initial"] = weights_digest(initial)
        self.show_progress = progress and self.ctx.is_main
        self.tokens_per_step = train.batch_size * config.seq_len
        self.observer = observer if self.ctx.is_main else None
        # under torchrun, the launcher (the elastic agent): a parent that changes has exited
        self.launcher = os.getppid()

    # -- set-up ----------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        done = distributed.on_main(
            lambda: finished_result(self.out_dir, self.fingerprint), self.ctx
        )
        if done is not None:
            return done
        if self.train.threads is not None and self.device.type == "cpu":
            torch.set_num_threads(self.train.threads)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if self.ctx.is_main:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        fsdp = self.ctx.enabled and self.train.distributed == "fsdp2"
        self.memory = training_memory(
            Shape.of(self.config), self.config.ffn_widths, self.micro, bf16=self.bf16,
            processes=self.ctx.world_size, sharded=fsdp,
        )  # fmt: skip
        self._check_memory()
        torch.manual_seed(self.seed)
        raw = GPT(self.config)  # built on CPU so the initial weights do not depend on the device
        if self.initial is not None:
            raw.load_state_dict(self.initial)
        _seed_dropout(self.seed, self.ctx.rank)
        raw.to(self.device)
        self.raw = raw
        # each run compiles from an empty cache, with room for its shapes (engine.compiling)
        limit = compile_for_training(raw, per_block=fsdp) if self.train.compile else None
        self.model = distributed.wrap_model(
            raw, self.ctx, self.train.distributed, self.bf16, self.device
        )
        fused = use_fused_adamw(self.device, fsdp)
        self.optimizer = torch.optim.AdamW(
            parameter_groups(raw, self.train.weight_decay),
            lr=self.train.lr,
            betas=self.train.betas,
            eps=self.train.eps,
            fused=fused or None,
        )
        self.state_io = _StateIO(raw, self.optimizer, self.ctx)
        self.order = TrainOrder(len(self.data.train), self.config.seq_len, self.seed)
        per_rank = self.micro * self.accum
        self.batches = StepBatches(
            self.data.train, self.order, self.config.seq_len, self.train.batch_size,
            first=self.ctx.rank * per_rank, count=per_rank, steps=self.total, device=self.device,
        )  # fmt: skip
        self.val_windows = validation_windows(
            len(self.data.val), self.config.seq_len, self.train.eval_tokens
        )
        self.step, self.train_seconds, self.wall_seconds = 0, 0.0, 0.0
        self.last_val: tuple[int, float] | None = None
        self.executions: list[dict[str, Any]] = []  # one per distinct setting it trained under
        self._resume()
        self.setting = execution(self.device, self.bf16, self.ctx.world_size, limit is not None)
        if self.ctx.is_main:
            write_config(self.out_dir, self.config)
        if self.observer is not None:
            self.observer.start(self.fingerprint, self.step)
        try:
            with recompile_limit(limit), _stop_signals() as stop:
                self.stop = stop
                result = self._loop()
        except BaseException as error:  # preempted, failed or interrupted: the observer closes
            if self.observer is not None:
                self.observer.end(None)
            if says_out_of_memory(error):
                raise self._out_of_memory() from error
            raise
        if self.observer is not None:
            self.observer.end(result.to_dict())
        return result

    def _check_memory(self) -> None:
        """Refuse, before the model is built, one whose training needs more memory than the
        device has free (every process learns whether any refused, so none waits for it)."""
        skip = os.environ.get("GEOSPEC_SKIP_MEMORY_CHECK") == "1"  # the user knows better
        free = None if skip else device_free_memory(self.device)
        problem = None
        if free is not None:
            problem = memory_refusal(
                Shape.of(self.config), self.config.ffn_widths, self.memory, free, str(self.device)
            )
        if self.ctx.enabled:
            flag = torch.tensor(float(problem is not None), device=self.device)
            if distributed.all_reduce_sum(flag, self.ctx).item() > 0 and problem is None:
                problem = "another process of this run has too little memory for it"
        if problem is not None:
            raise OutOfMemory(f"training {self.out_dir}: {problem}")

    def _out_of_memory(self) -> OutOfMemory:
        """The one-line error for an allocation that failed during training."""
        self.optimizer.zero_grad(set_to_none=True)  # what memory it can give back
        return OutOfMemory(
            f"training {self.out_dir}: ran out of memory at step {self.step + 1} (estimated "
            f"{self.memory.describe()} per process); the last checkpoint ({self._kept()}) is "
            "kept: "
            + advice(Shape.of(self.config), self.config.ffn_widths, self.memory)
            + ", then run again to resume"
        )

    def _resume(self) -> None:
        found: tuple[Path, dict[str, Any]] | None = None

        def header() -> dict[str, Any] | None:  # on rank 0, which alone may see the files
            nonlocal found
            try:
                found = read_checkpoint(self.out_dir)
            except DamagedCheckpoint as error:  # recomputable: train this run from the start
                sys.stderr.write(f"! {error}; training {self.out_dir} from the start\n")
                found = None
            if found is None:
                # A run killed before its first checkpoint starts over: its logged lines go too.
                truncate_metrics(self.out_dir, 0)
                return None
            state = found[1]
            _check_same_run(self.out_dir, json.loads(state["fingerprint"]), self.fingerprint)
            kept = {k: state[k] for k in ("step", "train_seconds", "wall_seconds", "last_val")}
            # absent from checkpoints written before geospec recorded it
            return {**kept, "executions": json.loads(state.get("executions", "[]"))}

        stored = distributed.on_main(header, self.ctx)
        if stored is None:
            return
        weights: dict[str, torch.Tensor] = {}
        optim: dict[str, Any] = {}
        rng: list[dict[str, torch.Tensor]] = []
        if found is not None:
            path, state = found
            weights, optim, rng = load_weights(path, self.config), state["optimizer"], state["rng"]
            truncate_metrics(self.out_dir, int(state["step"]))
        self.state_io.set(weights, optim)
        rng = distributed.broadcast_object(rng, self.ctx)
        if len(rng) == self.ctx.world_size:
            _set_rng_state(rng[self.ctx.rank], self.device)
        self.step = int(stored["step"])
        self.train_seconds = float(stored["train_seconds"])
        self.wall_seconds = float(stored["wall_seconds"])
        self.executions = list(stored["executions"])
        last = stored["last_val"]
        self.last_val = (int(last[0]), float(last[1])) if last else None

    # -- the loop --------------------------------------------------------------------------------

    def _loop(self) -> TrainResult:
        train, ctx = self.train, self.ctx
        reporter = TrainProgress(self.total, enabled=self.show_progress, start=self.step)
        interval_loss = torch.zeros((), device=self.device)
        interval_steps = 0
        session_start = time.perf_counter()
        tick = time.perf_counter()
        if self.step < self.total:
            self._computing()
        with reporter:
            while self.step < self.total:
                lr = learning_rate(train, self.step, self.total)
                interval_loss += self._step(lr)
                interval_steps += 1
                self.step += 1
                is_last = self.step == self.total
                stopping = not is_last and self._stop_requested()  # a signal: log, save, stop
                due_eval = is_last or (train.eval_interval and self.step % train.eval_interval == 0)
                due_ckpt = is_last or stopping or self.step % train.checkpoint_interval == 0
                if not (due_eval or due_ckpt or is_last or self.step % train.log_interval == 0):
                    reporter.advance(self.step)
                    continue
                # a sync point: everything below waits for the device
                loss = float(distributed.all_reduce_sum(interval_loss, ctx).item())
                loss /= interval_steps * ctx.world_size
                elapsed = time.perf_counter() - tick
                self.train_seconds += elapsed
                speed = interval_steps * self.tokens_per_step / max(elapsed, 1e-9)
                if not math.isfinite(loss):
                    self._fail(
                        f"the training loss became {loss} in steps "
                        f"{self.step - interval_steps + 1}..{self.step}"
                    )
                self._log(
                    {
                        "step": self.step,
                        "loss": loss,
                        "lr": lr,
                        "tokens": self.step * self.tokens_per_step,
                        "tokens_per_s": speed,
                    }
                )
                reporter.report(self.step, loss, speed)
                interval_loss.zero_()
                interval_steps = 0
                if due_eval:
                    val = self._evaluate()
                    self.last_val = (self.step, val)
                    self._log(
                        {
                            "step": self.step,
                            "val_loss": val,
                            "tokens": self.step * self.tokens_per_step,
                        }
                    )
                    reporter.note(f"step {self.step}: validation loss {val:.4f}")
                if due_ckpt:
                    self.wall_seconds += time.perf_counter() - session_start
                    session_start = time.perf_counter()
                    self._checkpoint()
                if stopping:
                    raise Preempted(
                        f"training {self.out_dir}: stopped by {self.stop.name} at step "
                        f"{self.step} of {self.total} after a checkpoint; run again to resume",
                        signal=self.stop.signal_name,
                    )
                tick = time.perf_counter()
        self.wall_seconds += time.perf_counter() - session_start
        return self._finish()

    def _stop_requested(self) -> bool:
        """Whether a stop signal arrived; under torchrun, also whether the launcher is gone, and
        every rank learns whether any rank has a reason to stop (at the steps where the loop syncs
        anyway), so all of them stop at the same step."""
        if not self.ctx.enabled:
            return self.stop.received
        if self.step % self.train.log_interval:
            return False
        self.stop.orphaned = os.getppid() != self.launcher
        flag = torch.tensor(float(self.stop.received), device=self.device)
        return bool(distributed.all_reduce_sum(flag, self.ctx).item() > 0)

    def _step(self, lr: float) -> torch.Tensor:
        """One optimizer step over the global batch; returns this process's mean loss."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self.batches.get(self.step)  # one copy to the device, sliced there
        total = torch.zeros((), device=self.device)
        for i in range(self.accum):
            rows = batch[i * self.micro : (i + 1) * self.micro]
            x, y = rows[:, :-1], rows[:, 1:]
            with distributed.gradient_sync(self.model, i == self.accum - 1):
                with _autocast(self.device, self.bf16):
                    _, loss = self.model(x, y)
                assert loss is not None
                (loss / self.accum).backward()
            total += loss.detach() / self.accum
        if self.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), self.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def _evaluate(self) -> float:
        return evaluate(
            self.raw,
            self.data.val,
            self.val_windows,
            self.config.seq_len,
            self.micro,
            self.device,
            self.ctx,
            self.bf16,
        )

    def _checkpoint(self) -> None:
        if not _all_finite(self.raw, self.ctx, self.device):
            self._fail(f"the weights became non-finite by step {self.step}")
        weights, optim = self.state_io.get()
        rng = distributed.gather_objects(_rng_state(self.device), self.ctx)
        if self.ctx.is_main:
            state = {
                "step": self.step,
                "sequences": self.step * self.train.batch_size,  # the data position
                "fingerprint": json.dumps(self.fingerprint),
                "optimizer": optim,
                "rng": rng,
                "train_seconds": self.train_seconds,
                "wall_seconds": self.wall_seconds,
                "last_val": list(self.last_val) if self.last_val else None,
                "world_size": self.ctx.world_size,
                "executions": json.dumps(self.executions),  # plain values: weights_only loads
            }
            write_checkpoint(self.out_dir, weights, state, self.config)
        distributed.barrier(self.ctx)

    def _kept(self) -> str:
        """Which step the last good checkpoint holds, for an error's text."""
        try:
            state = read_checkpoint(self.out_dir) if self.ctx.is_main else None
        except DamagedCheckpoint:
            state = None
        return f"step {state[1]['step']}" if state else "none yet"

    def _fail(self, what: str) -> None:
        raise GeospecError(
            f"training {self.out_dir}: {what}. The last good checkpoint ({self._kept()}) is kept; "
            "lower train.lr, lengthen train.warmup or set train.grad_clip, then run again (delete "
            "the directory to start over)"
        )

    def _log(self, row: dict[str, Any]) -> None:
        if self.ctx.is_main:
            append_metrics(self.out_dir, row)
        if self.observer is not None:
            self.observer.log(row)

    def _computing(self) -> None:
        """Record this session's setting: it trains or evaluates (a session that only rewrites
        result.json from the last checkpoint computed nothing, so adds none)."""
        if self.setting not in self.executions:
            self.executions.append(self.setting)

    def _finish(self) -> TrainResult:
        if self.last_val is None or self.last_val[0] != self.total:
            self._computing()
            self.last_val = (self.total, self._evaluate())
        tokens = self.total * self.tokens_per_step
        result = TrainResult(
            final_val_loss=self.last_val[1],
            steps=self.total,
            tokens=tokens,
            wall_seconds=self.wall_seconds,
            train_seconds=self.train_seconds,
            tokens_per_second=tokens / self.train_seconds if self.train_seconds else 0.0,
            params=self.config.num_params(),
            seed=self.seed,
        )
        if self.ctx.is_main:
            atomic_write_json(
                self.out_dir / RESULT_FILE,
                {
                    **result.to_dict(),
                    "widths": self.config.ffn_widths,
                    "fingerprint": self.fingerprint,
                    "execution": self.executions,
                    "checksums": weights_checksum(self.out_dir),
                },
            )
        distributed.barrier(self.ctx)
        return result
