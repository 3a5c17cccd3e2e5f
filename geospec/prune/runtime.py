"""What a GGUF file costs to run in llama.cpp (through llama-cpp-python, where it is installed):
prompt processing and generation in tokens/s, the method of benchmarks/pruned_runtime.py.

Prompt processing is ``prompt`` tokens in one batch, generation ``generate`` tokens one at a time
after it, on ``threads`` threads; each figure is the best of ``repeats`` rounds after one untimed
round (caches warm). Two files are compared round-robin (each round measures both), so a load
that comes and goes on a shared machine slows both alike. The token ids are fixed (and within
the file's vocabulary): speed does not depend on what the text says.
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Speed:
    """llama.cpp's throughput on one file, in tokens/s."""

    prompt: float
    generation: float


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
    paths: list[Path], threads: int = 2, prompt: int = 128, generate: int = 32, repeats: int = 3
) -> list[Speed]:
    """Each file's best :class:`Speed` over ``repeats`` round-robin rounds."""
    models = [_loaded(path, threads, prompt, generate) for path in paths]
    tokens = benchmark_tokens(prompt + generate, min(llm.n_vocab() for llm in models))
    for llm in models:  # the untimed round
        _round(llm, tokens, prompt)
    best = [Speed(0.0, 0.0) for _ in paths]
    for _ in range(repeats):
        for index, llm in enumerate(models):
            found = _round(llm, tokens, prompt)
            best[index] = Speed(
                max(best[index].prompt, found.prompt),
                max(best[index].generation, found.generation),
            )
    for llm in models:
        llm.close()
    return best


def speed_line(exported: Path, source: Path, threads: int = 2) -> str:
    """One line: the exported file's llama.cpp speed against its source file's, measured now."""
    ours, theirs = compare_speeds([exported, source], threads)
    return (
        f"llama.cpp on {threads} threads (best of 3): prompt {ours.prompt:,.0f} tok/s "
        f"({ours.prompt / theirs.prompt:.2f}x the source's {theirs.prompt:,.0f}), generation "
        f"{ours.generation:,.1f} tok/s ({ours.generation / theirs.generation:.2f}x the source's "
        f"{theirs.generation:,.1f})"
    )
