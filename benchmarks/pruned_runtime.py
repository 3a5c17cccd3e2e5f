"""Benchmark: what a pruned SmolLM2-135M costs to store and run, true-width against padded.

Loads SmolLM2-135M-Instruct's GGUF (``--gguf PATH``; ``nox -s gguf`` fetches it into
~/.cache/geospec-test), and writes four GGUF files (``--dtype``, f16 by default) with
:func:`geospec.prune.gguf_export.write_gguf`:

- ``unpruned``: every layer at 1536;
- ``uniform``: keep 1/2, every layer at 768;
- ``gw-spherical``: keep 1/2 at the widths the gw/spherical arm got in
  docs/results/smollm2-135m/prune.json (seed 0; 448 to 1536, two layers whole), at its true widths;
- ``gw-spherical padded``: the same model through the padded transformers export
  (``export_pruned(..., padded=True)``), every layer 1536 wide with zero units.

Which neurons a layer keeps does not change size or speed, so each layer keeps its first ones.
Each file is measured in a fresh process (peak RSS is that process's): the file size, llama.cpp's
parameter count, the peak resident memory after loading and running, prompt processing
(``--prompt`` tokens in one batch) and generation (``--generate`` tokens one at a time, after the
prompt) in tokens/s on ``--threads`` threads, the best of ``--repeats`` rounds and their median
(each round measures every file once, after one untimed pass, so a load that comes and goes
slows all alike), as What to ship times a file (:mod:`geospec.prune.runtime`: the same best and
median, the machine's load average read before the first round, with its warning where the load
exceeds the cores).
``--torch`` adds the same prompt and generation in PyTorch through ``geospec.load_pruned`` (the
padded model through ``AutoModelForCausalLM.from_pretrained``). Prints one table with every
figure and its ratio to the unpruned model's, measured in the same run (needs llama-cpp-python:
``nox -s llamacpp`` builds it).

``--files NAME=PATH ...`` measures GGUF files already written instead (the first is the baseline
every ratio is to): e.g. a model geospec pruned and exported against its source file,
``--files unpruned=qwen-1.5b.gguf keep-0.75=pruned.gguf``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = Path.home() / ".cache" / "geospec-test" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GGML_F32 = 0


def arm_widths() -> list[int]:
    record = json.loads((ROOT / "docs/results/smollm2-135m/prune.json").read_text())
    half = next(b for b in record["budgets"] if b["keep"] == 0.5)
    return [int(w) for w in half["arms"]["gw-spherical"]["widths"]["0"]]


def write_files(source: Path, out: Path, dtype: str, with_torch: bool) -> dict[str, Path]:
    """The four GGUF files (and, for --torch, the transformers exports they come from)."""
    import torch
    from transformers import AutoModelForCausalLM

    from geospec.engine.pretrained import load_pretrained
    from geospec.measure.cut import ffn_cut
    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.prune.gguf_export import write_gguf
    from geospec.prune.hf_export import export_pruned

    model = load_pretrained(source)
    ids = torch.tensor([[1, 2, 3, 4]])
    sites = find_ffn_sites(model, 576, lambda: logits_of(model, ids))
    full = [1536] * 30
    variants = {"unpruned": full, "uniform": [768] * 30, "gw-spherical": arm_widths()}
    files: dict[str, Path] = {}
    with torch.no_grad():
        for name, widths in variants.items():
            with ExitStack() as stack:
                for site, width in zip(sites, widths, strict=True):
                    stack.enter_context(ffn_cut(site.ffn, range(width)))
                files[name] = write_gguf(model, out / f"{name}.gguf", dtype, tokenizer=source).path
                if with_torch:
                    export_pruned(model, sites, widths, out / name)
                if name == "gw-spherical":
                    export_pruned(model, sites, widths, out / "padded", padded=True)
        padded = AutoModelForCausalLM.from_pretrained(out / "padded").eval()
        files["gw-spherical padded"] = write_gguf(
            padded, out / "gw-spherical-padded.gguf", dtype, tokenizer=source
        ).path
    return files


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, which Linux carries over
    an exec from the parent, it starts afresh in the new process)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure_llamacpp(path: str, threads: int, prompt: int, generate: int, repeats: int) -> None:
    """In a fresh process: one JSON line of the file's figures."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=path,
        n_ctx=prompt + generate + 8,
        n_batch=prompt,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    tokens = [(17 * i + 5) % 49000 + 100 for i in range(prompt + generate)]
    pp, tg = [], []
    for repeat in range(repeats + 1):  # the first pass warms caches and is not counted
        llm.reset()
        start = time.perf_counter()
        llm.eval(tokens[:prompt])
        pp.append(prompt / (time.perf_counter() - start))
        start = time.perf_counter()
        for token in tokens[prompt:]:
            llm.eval([token])
        tg.append(generate / (time.perf_counter() - start))
        if repeat == 0:
            pp, tg = [], []
    result = {
        "params": int(llama_cpp.llama_model_n_params(llm.model)),
        "rss_mb": peak_rss_mb(),
        "pp": max(pp),
        "tg": max(tg),
    }
    print(json.dumps(result))


def measure_torch(
    directory: str, padded: bool, threads: int, prompt: int, generate: int, repeats: int
) -> None:
    import torch

    torch.set_num_threads(threads)
    if padded:
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(directory).eval()
    else:
        import geospec

        model = geospec.load_pruned(directory)
    ids = torch.tensor([[(17 * i + 5) % 49000 + 100 for i in range(prompt)]])
    pp, tg = [], []
    with torch.no_grad():
        for repeat in range(repeats + 1):  # the first pass warms up and is not counted
            start = time.perf_counter()
            model(ids)
            pp.append(prompt / (time.perf_counter() - start))
            start = time.perf_counter()
            model.generate(
                ids[:, :8], max_new_tokens=generate, min_new_tokens=generate, do_sample=False
            )
            tg.append(generate / (time.perf_counter() - start))
            if repeat == 0:
                pp, tg = [], []
    rss = peak_rss_mb()
    print(json.dumps({"torch_rss_mb": rss, "torch_pp": max(pp), "torch_tg": max(tg)}))


def child(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=True
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gguf", type=Path, default=Path(os.environ.get("GEOSPEC_TEST_GGUF", DEFAULT_GGUF))
    )
    parser.add_argument("--dtype", default="f16", choices=["f32", "f16", "q8_0"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--generate", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch", action="store_true", help="also PyTorch via load_pruned")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-torch", help=argparse.SUPPRESS)
    parser.add_argument("--padded", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--files", nargs="+", metavar="NAME=PATH", help="measure these GGUFs")
    args = parser.parse_args()
    shape = (args.threads, args.prompt, args.generate, args.repeats)
    if args.child:
        measure_llamacpp(args.child, *shape)
        return
    if args.child_torch:
        measure_torch(args.child_torch, args.padded, *shape)
        return
    if args.files and args.torch:
        sys.exit("--files measures GGUF files in llama.cpp only; drop --torch")
    if not args.files and not args.gguf.is_file():
        sys.exit(f"--gguf {args.gguf}: not found (nox -s gguf fetches SmolLM2-135M's GGUF)")
    common = ["--threads", str(args.threads), "--prompt", str(args.prompt)]
    common += ["--generate", str(args.generate), "--repeats", "1"]
    from geospec.prune.runtime import Speed, Timing, load_words, machine_load

    runs: dict[str, list[dict[str, Any]]] = {}
    load = machine_load()  # read before any timing, so that its own threads are not in it
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        if args.files:
            files = {name: Path(path) for name, _, path in (f.partition("=") for f in args.files)}
            missing = [str(path) for path in files.values() if not path.is_file()]
            if missing:
                sys.exit(f"--files: not found: {', '.join(missing)}")
        else:
            files = write_files(args.gguf, out, args.dtype, args.torch)
        # round robin: each round measures every file once, so a load that comes and goes on a
        # shared machine slows every model alike; each figure is its best round's, beside the median
        for _ in range(args.repeats):
            for name, path in files.items():
                row = {"size_mb": path.stat().st_size / 2**20}
                row |= child(["--child", str(path), *common])
                if args.torch:
                    padded = name.endswith("padded")
                    directory = out / ("padded" if padded else name)
                    flags = ["--padded"] if padded else []
                    row |= child(["--child-torch", str(directory), *flags, *common])
                runs.setdefault(name, []).append(row)
    # speeds: each figure's best round and its median over the rounds (the spread a shared
    # machine leaves), as What to ship gives them; sizes, parameters and memory are the same
    # every round (the last one's)
    rows: dict[str, dict[str, Any]] = {}
    for name, rounds in runs.items():
        rows[name] = dict(rounds[-1])
        for prefix in ("", "torch_") if args.torch else ("",):
            pp, tg = prefix + "pp", prefix + "tg"
            timing = Timing.of([Speed(r[pp], r[tg]) for r in rounds])
            rows[name] |= {pp: timing.best.prompt, tg: timing.best.generation}
            rows[name] |= {
                pp + "_median": timing.median.prompt,
                tg + "_median": timing.median.generation,
            }
    base = next(iter(rows.values()))  # the unpruned model (--files: the first file)
    columns = [("size_mb", "file MiB"), ("params", "parameters"), ("rss_mb", "peak RSS MiB"),
               ("pp", f"prompt tok/s ({args.prompt})"),
               ("tg", f"generation tok/s ({args.generate})")]  # fmt: skip
    if args.torch:
        columns += [("torch_rss_mb", "PyTorch RSS MiB"), ("torch_pp", "PyTorch prompt tok/s"),
                    ("torch_tg", "PyTorch generation tok/s")]  # fmt: skip
    what = "GGUF files given" if args.files else f"SmolLM2-135M, {args.dtype} GGUF"
    print(f"{what}, llama.cpp on {args.threads} threads, best of {args.repeats} rounds "
          f"[median]; each cell: value (ratio to {next(iter(rows))}); {load_words(load)} "
          "before the first round")  # fmt: skip
    print("| model | " + " | ".join(title for _, title in columns) + " |")
    print("|---|" + "---|" * len(columns))
    for name, row in rows.items():
        cells = []
        for key, _ in columns:
            value = row[key]
            text = f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
            cell = f"{text} ({value / base[key]:.3f}x)"
            if key + "_median" in row:
                median = row[key + "_median"]
                cell += f" [{median:,.1f} ({median / base[key + '_median']:.3f}x)]"
            cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
