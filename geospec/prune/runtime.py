"""What a GGUF file costs to run in llama.cpp (through llama-cpp-python, where it is installed):
prompt processing and generation in tokens/s, the method of benchmarks/pruned_runtime.py.

Prompt processing is ``prompt`` tokens in one batch, generation ``generate`` tokens one at a time
after it, on ``threads`` threads; each file is timed ``repeats`` rounds after one untimed round
(caches warm), and each figure is given as the best and the median of those rounds: the best is
what the file does when nothing else runs, the median's distance from it the spread the machine's
other work put in. Two files are compared round-robin (each round measures both), so a load that
comes and goes on a shared machine slows both alike. The machine's load average goes with every
line, and a warning where the 1-minute load exceeds the cores this process may use (the figures
are then the other work's as much as the file's). The token ids are fixed (and within the file's
vocabulary): speed does not depend on what the text says.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Timed rounds per file by default: enough for a median to mean something.
ROUNDS = 5


@dataclass(frozen=True)
class Speed:
    """llama.cpp's throughput on one file, in tokens/s."""

    prompt: float
    generation: float


@dataclass(frozen=True)
class Timing:
    """One file's speeds over its timed rounds: the best and the median of each figure."""

    best: Speed
    median: Speed
    rounds: int

    @classmethod
    def of(cls, rounds: Sequence[Speed]) -> Timing:
        """The best and median of ``rounds`` (each figure on its own)."""
        prompts = [r.prompt for r in rounds]
        generations = [r.generation for r in rounds]
        return cls(
            Speed(max(prompts), max(generations)),
            Speed(statistics.median(prompts), statistics.median(generations)),
            len(rounds),
        )


@dataclass(frozen=True)
class Load:
    """The machine's load average (1, 5 and 15 minutes) against the cores this process may use,
    read just before a timing (so that the timing's own threads are not in it)."""

    one: float
    five: float
    fifteen: float
    cores: int

    @property
    def busy(self) -> bool:
        """More runnable work than cores over the last minute: timings are not the file's alone."""
        return self.one > self.cores

    def words(self) -> str:
        """``load 1.52/1.40/0.98 on 2 cores``, with the warning where :attr:`busy`."""
        said = f"load {self.one:.2f}/{self.five:.2f}/{self.fifteen:.2f} on {self.cores} cores"
        if self.busy:
            said += (
                f" (warning: the 1-minute load exceeds the {self.cores} cores, so other work "
                "shaped these speeds; time it again on a quiet machine)"
            )
        return said

    def record(self) -> dict[str, Any]:
        """The load as a JSON record's fields."""
        return {"load": [self.one, self.five, self.fifteen], "cores": self.cores}


def machine_load() -> Load | None:
    """The load average now (None where the system gives none: Windows)."""
    from geospec.hardware import available_cores

    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return Load(one, five, fifteen, available_cores())


def load_words(load: Load | None) -> str:
    """:meth:`Load.words`, or that the system gives no load average."""
    return "no load average on this system" if load is None else load.words()


def have_llamacpp() -> bool:
    """Whether llama-cpp-python is importable (an optional install: ``pip install
    llama-cpp-python``)."""
    return importlib.util.find_spec("llama_cpp") is not None


def benchmark_tokens(count: int, vocab: int = 49_100) -> list[int]:
    """``count`` fixed token ids, below ``vocab`` (the benchmark's ids for any vocabulary of
    49,100 tokens or more)."""
    span = min(49_000, vocab - 100) if vocab > 200 else vocab
    offset = 100 if vocab > 200 else 0
    return [(17 * i + 5) % span + offset for i in range(count)]


def _loaded(path: Path, threads: int, prompt: int, generate: int) -> Any:
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=prompt + generate + 8,
        n_batch=prompt,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )


def _round(llm: Any, tokens: list[int], prompt: int) -> Speed:
    llm.reset()
    start = time.perf_counter()
    llm.eval(tokens[:prompt])
    processed = prompt / (time.perf_counter() - start)
    start = time.perf_counter()
    for token in tokens[prompt:]:
        llm.eval([token])
    generated = (len(tokens) - prompt) / (time.perf_counter() - start)
    return Speed(processed, generated)


def compare_speeds(
    paths: list[Path],
    threads: int = 2,
    prompt: int = 128,
    generate: int = 32,
    repeats: int = ROUNDS,
) -> list[Timing]:
    """Each file's :class:`Timing` (best and median) over ``repeats`` round-robin rounds."""
    models = [_loaded(path, threads, prompt, generate) for path in paths]
    tokens = benchmark_tokens(prompt + generate, min(llm.n_vocab() for llm in models))
    for llm in models:  # the untimed round
        _round(llm, tokens, prompt)
    rounds: list[list[Speed]] = [[] for _ in paths]
    for _ in range(repeats):
        for index, llm in enumerate(models):
            rounds[index].append(_round(llm, tokens, prompt))
    for llm in models:
        llm.close()
    return [Timing.of(found) for found in rounds]


def spread_words(ours: Timing, theirs: Timing) -> str:
    """The two files' prompt and generation speeds as best and median, each ratio to the
    source's (``prompt 1.36x best, 1.31x median (300/290 tok/s against 221/221)``)."""
    parts = []
    for figure, digits in (("prompt", 0), ("generation", 1)):
        best = getattr(ours.best, figure) / getattr(theirs.best, figure)
        median = getattr(ours.median, figure) / getattr(theirs.median, figure)
        parts.append(
            f"{figure} {best:.2f}x best, {median:.2f}x median "
            f"({getattr(ours.best, figure):,.{digits}f}/{getattr(ours.median, figure):,.{digits}f}"
            f" tok/s against the source's {getattr(theirs.best, figure):,.{digits}f}/"
            f"{getattr(theirs.median, figure):,.{digits}f})"
        )
    return ", ".join(parts)


def speed_line(exported: Path, source: Path, threads: int = 2, repeats: int = ROUNDS) -> str:
    """One line: the exported file's llama.cpp speed against its source file's, measured now,
    best and median of ``repeats`` rounds, with the machine's load."""
    load = machine_load()
    ours, theirs = compare_speeds([exported, source], threads, repeats=repeats)
    return (
        f"llama.cpp on {threads} threads ({repeats} rounds, best/median): "
        f"{spread_words(ours, theirs)}; {load_words(load)}"
    )
