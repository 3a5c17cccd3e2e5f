"""A dry run of a spec's shapes: every arm's model built at full size and trained for a few steps
on this machine (a CPU will do) with a short context, to check before a GPU job is submitted that
the shapes build, train and fit, and what the job will cost.

Measured here, per arm (each in a fresh process): the parameters (of the model built), the peak
resident memory the arm's build and steps added to the process, and the median time of one
optimizer step (fp32, eager) at the short context. Computed, not measured: the memory of the
training state on each GPU (fp32 weights, gradients and AdamW's two moments: 16 bytes a
parameter; activations not included), and the tokens/s and GPU-hours of the spec's runs at an
assumed model FLOPs utilisation (MFU) of a GPU's dense bf16 peak: 6 x parameters FLOPs a token
(:func:`gpu_cost`).

Arms whose widths need measured profiles use the run directory's ``widths.json`` when it exists,
else widths their schedule gives for a stand-in profile rising linearly with depth (the measured
ones will differ; the parameter count does not, every arm keeping the uniform FFN budget).
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from geospec.errors import UsageError
from geospec.spec.sections import GPT2Tokenizer, ModelSpec, Spec

#: the dense bf16 peak of an H100/H200 SXM (TFLOP/s): the default of ``--peak-tflops``
H100_BF16_TFLOPS = 989.0
#: the MFU assumed by default: docs/engine.md's expectation for the 256m and 440m specs
ASSUMED_MFU = 0.35
#: bytes of training state a parameter (fp32 weight, gradient, AdamW's two moments)
STATE_BYTES_PER_PARAM = 16
GPT2_VOCAB = 50257


@dataclass(frozen=True)
class ArmRehearsal:
    """One arm's dry run: what was measured here and what a GPU would need."""

    arm: str
    widths: list[int]
    stand_in: bool
    """Widths from a stand-in profile (the arm needs measured profiles that do not exist yet)."""
    params: int
    peak_memory: int
    """Bytes of resident memory the arm's build and steps added at their peak (measured)."""
    step_seconds: float
    """Median seconds of one optimizer step at the short context (measured)."""
    cpu_tokens_per_second: float
    gpu_state_bytes: int
    gpu_tokens_per_second: float
    gpu_hours: float
    """GPU-hours of one run of the spec's ``train.tokens`` at the assumed MFU."""


def gpu_cost(params: int, tokens: int, mfu: float, peak_tflops: float) -> tuple[float, float]:
    """(tokens/s of one GPU, GPU-hours for ``tokens``) at ``mfu`` of ``peak_tflops``, counting
    6 x ``params`` FLOPs a token (forward and backward; attention's own FLOPs not counted, as
    in the MFU of docs/engine.md)."""
    tokens_per_second = mfu * peak_tflops * 1e12 / (6 * params)
    return tokens_per_second, tokens / tokens_per_second / 3600


def dry_run_vocab(spec: Spec) -> int:
    """The vocabulary the model is built with, without preparing any data."""
    if spec.model.vocab_size is not None:
        return spec.model.vocab_size
    tokenizer = spec.data.tokenizer
    if isinstance(tokenizer, GPT2Tokenizer):
        return GPT2_VOCAB
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab is None:
        raise UsageError(
            "model.vocab_size: a dry run builds the model without reading the tokenizer; set "
            "model.vocab_size (--set model.vocab_size=N) to the tokenizer's vocabulary"
        )
    return int(vocab)


def dry_run_widths(spec: Spec) -> dict[str, tuple[list[int], bool]]:
    """Every arm's widths and whether they come from a stand-in profile."""
    from geospec.rundir.artifacts import json_problem, read_json
    from geospec.rundir.layout import WIDTHS_FILE
    from geospec.solve.widths import compute_widths

    m = spec.model
    computed = compute_widths(m, spec.arms, {})
    widths = {name: (w, False) for name, w in computed.widths.items()}
    stored = Path(spec.run_dir) / WIDTHS_FILE
    if stored.is_file() and json_problem(stored, "arms") is None:
        for name, entry in read_json(stored)["arms"].items():
            widths.setdefault(name, ([int(w) for w in entry["widths"]], False))
    missing = {p for name, needs in computed.pending.items() if name not in widths for p in needs}
    if missing:
        ramp = [1.0 + layer / max(m.n_layers - 1, 1) for layer in range(m.n_layers)]
        stand_in = compute_widths(m, spec.arms, dict.fromkeys(missing, ramp))
        for name, w in stand_in.widths.items():
            widths.setdefault(name, (w, True))
    return {arm.name: widths[arm.name] for arm in spec.arms if arm.name in widths}


def rehearse(
    spec: Spec,
    steps: int = 3,
    context: int = 64,
    batch: int = 1,
    mfu: float = ASSUMED_MFU,
    peak_tflops: float = H100_BF16_TFLOPS,
) -> Iterator[ArmRehearsal]:
    """Each arm's dry run, in spec order: built and trained ``steps`` steps of ``batch``
    sequences of ``context`` random tokens on the CPU, each arm in a fresh process."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from geospec.engine.train import total_steps

    if not 0 < mfu <= 1:
        raise UsageError(f"--mfu {mfu}: give a fraction in (0, 1], for example 0.35")
    vocab = dry_run_vocab(spec)
    context = min(context, spec.model.seq_len)
    seq_len = spec.model.seq_len
    tokens = total_steps(spec.train, seq_len) * spec.train.batch_size * seq_len
    # each arm in a process forked from a server that imported torch once (and ran nothing)
    processes = multiprocessing.get_context("forkserver")
    processes.set_forkserver_preload(["torch", "geospec.engine.model", __name__])
    for arm, (widths, stand_in) in dry_run_widths(spec).items():
        # a fresh process per arm: its peak is its own, not what an earlier arm left allocated
        with ProcessPoolExecutor(1, mp_context=processes) as process:
            params, peak, times = process.submit(
                step_arm, spec.model, widths, vocab, steps, context, batch
            ).result()
        step = sorted(times)[len(times) // 2]
        gpu_tokens_per_second, hours = gpu_cost(params, tokens, mfu, peak_tflops)
        yield ArmRehearsal(
            arm=arm,
            widths=widths,
            stand_in=stand_in,
            params=params,
            peak_memory=peak,
            step_seconds=step,
            cpu_tokens_per_second=batch * context / step,
            gpu_state_bytes=STATE_BYTES_PER_PARAM * params,
            gpu_tokens_per_second=gpu_tokens_per_second,
            gpu_hours=hours,
        )


def step_arm(
    model: ModelSpec, widths: list[int], vocab: int, steps: int, context: int, batch: int
) -> tuple[int, int, list[float]]:
    """Build the model, train ``steps`` timed steps (after one untimed: it allocates AdamW's
    state) on random tokens; (parameters, peak memory added in bytes, seconds of each step)."""
    import torch

    from geospec.engine.model import GPT, config_from_spec

    with peak_rss() as peak:
        torch.manual_seed(0)
        gpt = GPT(config_from_spec(model, widths, vocab))
        params = sum(p.numel() for p in gpt.parameters())
        optimizer = torch.optim.AdamW(gpt.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(0)
        times = []
        for _ in range(steps + 1):
            idx = torch.randint(0, vocab, (batch, context + 1), generator=generator)
            started = time.perf_counter()
            _, loss = gpt(idx[:, :-1], idx[:, 1:])
            loss.backward()
            optimizer.step()
            peak.sample()  # weights, gradients and AdamW's moments are all held here
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - started)
    return params, peak.bytes, times[1:]


class _Peak:
    """The peak so far (``bytes``, set when the block ends); ``sample`` reads the memory now."""

    bytes = 0

    def sample(self) -> None:
        pass


@contextlib.contextmanager
def peak_rss(interval: float = 0.005) -> Iterator[_Peak]:
    """The peak resident memory of this process inside the block, above what it held when the
    block began (``/proc/self/statm`` sampled every ``interval`` seconds; where that file does
    not exist, the process's lifetime peak ``ru_maxrss`` minus the starting one)."""
    peak = _Peak()
    statm = Path("/proc/self/statm")
    if not statm.exists():  # pragma: no cover - not Linux
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        yield peak
        peak.bytes = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        return
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        return int(statm.read_text().split()[1]) * page

    start = highest = rss()
    done = threading.Event()

    def sample() -> None:
        nonlocal highest
        highest = max(highest, rss())

    def sample_until_done() -> None:
        while not done.wait(interval):
            sample()

    peak.sample = sample  # type: ignore[method-assign]
    sampler = threading.Thread(target=sample_until_done, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()
        sample()
        peak.bytes = highest - start
