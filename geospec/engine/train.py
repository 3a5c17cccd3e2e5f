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

A run is two objects: :class:`_Run`, what the run is (settings, processes, device, steps, its
identity from :mod:`geospec.engine.identity`, its :class:`~geospec.engine.cadence.Cadence`), fixed
before anything is built; and :class:`_Session`, one session training it (model, optimizer,
batches, and the :class:`~geospec.engine.train_state.TrainState` a checkpoint saves and restores).
A scheduler's SIGTERM or SIGUSR1, or under torchrun a launcher gone
(:mod:`geospec.engine.stopping`), stops a run at the end of its current step: it writes a
checkpoint of that step and raises :class:`geospec.errors.Preempted`, whose exit status (75,
``REQUEUE_EXIT_CODE``) asks for a requeue; started again, it resumes to the result an
uninterrupted run has.

An observer (:class:`TrainObserver`; the pipeline's experiment trackers) is told on rank 0 where
the run starts, every row ``metrics.jsonl`` gets and the result; the engine knows nothing of what
it does with them."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn, Protocol

import numpy as np
import torch
from torch import nn

from geospec.engine import distributed
from geospec.engine.batches import StepBatches, TrainOrder, validation_windows, window_tensors
from geospec.engine.cadence import Cadence
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
from geospec.engine.distill import Teacher
from geospec.engine.distributed import DistContext
from geospec.engine.identity import (  # defined here before they moved: the old names stay
    check_same_run,
    execution,
    fingerprint,
    weights_digest,
)
from geospec.engine.model import GPT, GPTConfig
from geospec.engine.progress import TrainProgress
from geospec.engine.run_files import RESULT_FILE
from geospec.engine.stopping import Stopping, StopSignal, stop_signals
from geospec.engine.token_data import TokenData
from geospec.engine.train_state import TrainState
from geospec.errors import GeospecError, OutOfMemory, Preempted, UsageError
from geospec.shapes.memory import (
    advice,
    host_available,
    memory_refusal,
    micro_batching,  # defined here before it moved: the old name stays
    says_out_of_memory,
    training_memory,
)
from geospec.shapes.model_size import Shape
from geospec.spec.sections import TrainSpec
from geospec.storage.atomic import atomic_write_json

__all__ = [
    "TrainObserver",
    "TrainResult",
    "execution",
    "fingerprint",
    "load_model",
    "resolve_device",
    "total_steps",
    "train_model",
    "weights_digest",
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


def finished_result(out_dir: Path, wanted: dict[str, Any]) -> TrainResult | None:
    path = out_dir / RESULT_FILE
    try:
        data = json.loads(path.read_text())
        result = TrainResult.from_dict(data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # missing or damaged: the run finishes again from its last checkpoint
    check_same_run(out_dir, data.get("fingerprint", {}), wanted)
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
    teacher: Teacher | None = None,
) -> TrainResult:
    """Train (or resume, or return the finished result of) one model; see the module docstring.
    ``observer`` watches it on rank 0 (not a finished run returned as it is). ``initial``: the
    model's starting weights (a pretrained or pruned model, fine-tuned) instead of the seeded
    initialisation; the fingerprint holds their digest, so a directory never mixes two.
    ``teacher``: distil from it (:mod:`geospec.engine.distill`; the validation loss stays the
    cross-entropy on the data); the fingerprint holds its identity."""
    run = _Run(
        train, config, data, Path(out_dir), seed, steps, progress, observer, initial, teacher
    )
    return run.run()


class _Run:
    """What one run is, fixed before it starts: its settings, processes, device, steps, identity
    and cadence. :meth:`run` returns a finished run's result or trains it in a :class:`_Session`."""

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
        teacher: Teacher | None = None,
    ) -> None:
        self.train, self.config, self.data, self.out_dir, self.seed = (
            train,
            config,
            data,
            out_dir,
            seed,
        )
        self.initial = initial
        self.teacher = teacher
        self.ctx = distributed.init_distributed()
        self.device = resolve_device(train.device, self.ctx.local_rank)
        self.bf16 = train.precision == "bf16" or (
            train.precision == "auto" and self.device.type == "cuda"
        )
        self.fsdp = self.ctx.enabled and train.distributed == "fsdp2"
        self.total = total_steps(train, config.seq_len, steps)
        self.micro, self.accum = micro_batching(train, self.ctx.world_size)
        self.tokens_per_step = train.batch_size * config.seq_len
        self.fingerprint = fingerprint(
            train, config, data, seed, self.total, initial,
            teacher.identity() if teacher is not None else None,
        )  # fmt: skip
        self.cadence = Cadence.of(train)
        self.stopping = Stopping(self.ctx, self.device, train.log_interval)
        self.memory = training_memory(
            Shape.of(config), config.ffn_widths, self.micro, bf16=self.bf16,
            processes=self.ctx.world_size, sharded=self.fsdp,
        )  # fmt: skip
        self.show_progress = progress and self.ctx.is_main
        self.observer = observer if self.ctx.is_main else None

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
        self._check_memory()
        session = _Session(self)
        if self.ctx.is_main:
            write_config(self.out_dir, self.config)
        if self.observer is not None:
            self.observer.start(self.fingerprint, session.state.step)
        try:
            with recompile_limit(session.compile_limit), stop_signals() as stop:
                result = session.train(stop)
        except BaseException as error:  # preempted, failed or interrupted: the observer closes
            if self.observer is not None:
                self.observer.end(None)
            if says_out_of_memory(error):
                raise session.out_of_memory() from error
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

    def kept(self) -> str:
        """Which step the last good checkpoint holds, for an error's text."""
        try:
            found = read_checkpoint(self.out_dir) if self.ctx.is_main else None
        except DamagedCheckpoint:
            found = None
        return f"step {found[1]['step']}" if found else "none yet"

    def fail(self, what: str) -> NoReturn:
        raise GeospecError(
            f"training {self.out_dir}: {what}. The last good checkpoint ({self.kept()}) is kept; "
            "lower train.lr, lengthen train.warmup or set train.grad_clip, then run again (delete "
            "the directory to start over)"
        )

    def log(self, row: dict[str, Any]) -> None:
        if self.ctx.is_main:
            append_metrics(self.out_dir, row)
        if self.observer is not None:
            self.observer.log(row)


class _Session:
    """One session of a run: its model, optimizer and batches built, its state resumed from the
    last checkpoint (or fresh), trained to the end or to a stop."""

    def __init__(self, run: _Run) -> None:
        self.run = run
        train, config, ctx, device = run.train, run.config, run.ctx, run.device
        torch.manual_seed(run.seed)
        raw = GPT(config)  # built on CPU so the initial weights do not depend on the device
        if run.initial is not None:
            raw.load_state_dict(run.initial)
        _seed_dropout(run.seed, ctx.rank)
        raw.to(device)
        self.raw = raw
        self.teacher = run.teacher.to(device) if run.teacher is not None else None
        # each run compiles from an empty cache, with room for its shapes (engine.compiling)
        self.compile_limit = (
            compile_for_training(raw, per_block=run.fsdp) if train.compile else None
        )
        self.model = distributed.wrap_model(raw, ctx, train.distributed, run.bf16, device)
        self.optimizer = torch.optim.AdamW(
            parameter_groups(raw, train.weight_decay),
            lr=train.lr,
            betas=train.betas,
            eps=train.eps,
            fused=use_fused_adamw(device, run.fsdp) or None,
        )
        self.state_io = _StateIO(raw, self.optimizer, ctx)
        per_rank = run.micro * run.accum
        self.batches = StepBatches(
            run.data.train, TrainOrder(len(run.data.train), config.seq_len, run.seed),
            config.seq_len, train.batch_size, first=ctx.rank * per_rank, count=per_rank,
            steps=run.total, device=device,
        )  # fmt: skip
        self.val_windows = validation_windows(len(run.data.val), config.seq_len, train.eval_tokens)
        self.state = self._resume()
        self.setting = execution(device, run.bf16, ctx.world_size, self.compile_limit is not None)

    def _resume(self) -> TrainState:
        """The state of the last checkpoint, its weights, optimizer and RNG loaded (a fresh state
        where there is none)."""
        run = self.run
        found: tuple[Path, dict[str, Any]] | None = None

        def header() -> TrainState | None:  # on rank 0, which alone may see the files
            nonlocal found
            try:
                found = read_checkpoint(run.out_dir)
            except DamagedCheckpoint as error:  # recomputable: train this run from the start
                sys.stderr.write(f"! {error}; training {run.out_dir} from the start\n")
                found = None
            if found is None:
                # A run killed before its first checkpoint starts over: its logged lines go too.
                truncate_metrics(run.out_dir, 0)
                return None
            check_same_run(run.out_dir, TrainState.fingerprint_of(found[1]), run.fingerprint)
            return TrainState.from_checkpoint(found[1])

        state = distributed.on_main(header, run.ctx)
        if state is None:
            return TrainState()
        weights: dict[str, torch.Tensor] = {}
        optim: dict[str, Any] = {}
        rng: list[dict[str, torch.Tensor]] = []
        if found is not None:
            path, checkpoint = found
            weights = load_weights(path, run.config)
            optim, rng = TrainState.optimizer_and_rng(checkpoint)
            truncate_metrics(run.out_dir, state.step)
        self.state_io.set(weights, optim)
        rng = distributed.broadcast_object(rng, run.ctx)
        if len(rng) == run.ctx.world_size:
            _set_rng_state(rng[run.ctx.rank], run.device)
        return state

    # -- the loop --------------------------------------------------------------------------------

    def train(self, stop: StopSignal) -> TrainResult:
        run, state, ctx = self.run, self.state, self.run.ctx
        reporter = TrainProgress(run.total, enabled=run.show_progress, start=state.step)
        interval_loss = torch.zeros((), device=run.device)
        interval_steps = 0
        session_start = time.perf_counter()
        tick = time.perf_counter()
        if state.step < run.total:
            state.computing(self.setting)
        with reporter:
            while state.step < run.total:
                lr = learning_rate(run.train, state.step, run.total)
                interval_loss += self._step(lr)
                interval_steps += 1
                state.step += 1
                is_last = state.step == run.total
                # a signal: log, save, stop
                stopping = not is_last and run.stopping.requested(stop, state.step)
                due = run.cadence.due(state.step, run.total, stopping)
                if not due.log:
                    reporter.advance(state.step)
                    continue
                # a sync point: everything below waits for the device
                loss = float(distributed.all_reduce_sum(interval_loss, ctx).item())
                loss /= interval_steps * ctx.world_size
                elapsed = time.perf_counter() - tick
                state.train_seconds += elapsed
                speed = interval_steps * run.tokens_per_step / max(elapsed, 1e-9)
                if not math.isfinite(loss):
                    run.fail(
                        f"the training loss became {loss} in steps "
                        f"{state.step - interval_steps + 1}..{state.step}"
                    )
                run.log(
                    {
                        "step": state.step,
                        "loss": loss,
                        "lr": lr,
                        "tokens": state.step * run.tokens_per_step,
                        "tokens_per_s": speed,
                    }
                )
                reporter.report(state.step, loss, speed)
                interval_loss.zero_()
                interval_steps = 0
                if due.evaluate:
                    val = self._evaluate()
                    state.last_val = (state.step, val)
                    run.log(
                        {
                            "step": state.step,
                            "val_loss": val,
                            "tokens": state.step * run.tokens_per_step,
                        }
                    )
                    reporter.note(f"step {state.step}: validation loss {val:.4f}")
                if due.checkpoint:
                    state.wall_seconds += time.perf_counter() - session_start
                    session_start = time.perf_counter()
                    self._checkpoint()
                if stopping:
                    raise Preempted(
                        f"training {run.out_dir}: stopped by {stop.name} at step "
                        f"{state.step} of {run.total} after a checkpoint; run again to resume",
                        signal=stop.signal_name,
                    )
                tick = time.perf_counter()
        state.wall_seconds += time.perf_counter() - session_start
        return self._finish()

    def _step(self, lr: float) -> torch.Tensor:
        """One optimizer step over the global batch; returns this process's mean loss."""
        run = self.run
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self.batches.get(self.state.step)  # one copy to the device, sliced there
        total = torch.zeros((), device=run.device)
        for i in range(run.accum):
            rows = batch[i * run.micro : (i + 1) * run.micro]
            x, y = rows[:, :-1], rows[:, 1:]
            with distributed.gradient_sync(self.model, i == run.accum - 1):
                with _autocast(run.device, run.bf16):
                    logits, loss = self.model(x, y)
                    assert loss is not None
                    if self.teacher is not None:
                        loss = self.teacher.loss(x, logits, loss)
                (loss / run.accum).backward()
            total += loss.detach() / run.accum
        if run.train.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.raw.parameters(), run.train.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total

    def _evaluate(self) -> float:
        run = self.run
        return evaluate(
            self.raw, run.data.val, self.val_windows, run.config.seq_len, run.micro, run.device,
            run.ctx, run.bf16,
        )  # fmt: skip

    def _checkpoint(self) -> None:
        run, state = self.run, self.state
        if not _all_finite(self.raw, run.ctx, run.device):
            run.fail(f"the weights became non-finite by step {state.step}")
        weights, optim = self.state_io.get()
        rng = distributed.gather_objects(_rng_state(run.device), run.ctx)
        if run.ctx.is_main:
            trainer_state = state.to_checkpoint(
                fingerprint=run.fingerprint, batch_size=run.train.batch_size,
                world_size=run.ctx.world_size, optimizer=optim, rng=rng,
            )  # fmt: skip
            write_checkpoint(run.out_dir, weights, trainer_state, run.config)
        distributed.barrier(run.ctx)

    def _finish(self) -> TrainResult:
        run, state = self.run, self.state
        if state.last_val is None or state.last_val[0] != run.total:
            state.computing(self.setting)  # a session that only rewrites result.json adds none
            state.last_val = (run.total, self._evaluate())
        tokens = run.total * run.tokens_per_step
        result = TrainResult(
            final_val_loss=state.last_val[1],
            steps=run.total,
            tokens=tokens,
            wall_seconds=state.wall_seconds,
            train_seconds=state.train_seconds,
            tokens_per_second=tokens / state.train_seconds if state.train_seconds else 0.0,
            params=run.config.num_params(),
            seed=run.seed,
        )
        if run.ctx.is_main:
            atomic_write_json(
                run.out_dir / RESULT_FILE,
                {
                    **result.to_dict(),
                    "widths": run.config.ffn_widths,
                    "fingerprint": run.fingerprint,
                    "execution": state.executions,
                    "checksums": weights_checksum(run.out_dir),
                },
            )
        distributed.barrier(run.ctx)
        return result

    def out_of_memory(self) -> OutOfMemory:
        """The one-line error for an allocation that failed during training."""
        run = self.run
        self.optimizer.zero_grad(set_to_none=True)  # what memory it can give back
        return OutOfMemory(
            f"training {run.out_dir}: ran out of memory at step {self.state.step + 1} (estimated "
            f"{run.memory.describe()} per process); the last checkpoint ({run.kept()}) is "
            "kept: "
            + advice(Shape.of(run.config), run.config.ffn_widths, run.memory)
            + ", then run again to resume"
        )
