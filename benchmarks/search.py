"""Benchmark: the evolutionary search allocation (``evolve``) on SmolLM2-135M on this machine,
in float32 and the cheaper ways of scoring its candidates, with their agreement.

Loads SmolLM2-135M's GGUF (``--gguf PATH``, the gguf extra; its calibration windows are the start
of bundled Austen in its own tokenizer; without it a Llama of SmolLM2's shape with random weights
and random tokens; ``--tiny``: a Llama of 4 small layers, to check the script), scores the
neurons (activation) on ``--windows`` calibration windows of ``--seq-len`` tokens, and runs
``--generations`` generations of the search at ``--keep`` from uniform, as the prune stage runs
it (each candidate at its true widths from its first changed layer). Each generation is run
once per way (``--ways``), all from the float32 search's parent, so every way scores the same
offspring on the same windows:

- ``float32``: the KL over the whole vocabulary in float32 (the default; the reference);
- ``bfloat16``: the same under ``compute_dtype = "bfloat16"`` (autocast, float32 weights);
- ``<dtype>-top<K>``: the KL over the unpruned model's top K tokens with the rest lumped into
  one bucket (``CalibrationFitness(top_k=K)``), in that dtype;
- ``...-lstsq`` / ``...-mean`` (after any of those): over repaired levels (``RepairedLevels``),
  each level re-fitted by least squares (``--damping``, with an intercept) from the unpruned
  model's moments on the calibration windows, or mean-compensated, as ``evolve`` searches an
  arm whose ``repair`` is set. The moments' one pass is timed apart (``moments_s``), not in the
  generations; each level's first solve is in them.

The unpruned model's log-probabilities are computed before the clock starts (each way its own,
in its dtype). Prints per way the seconds per generation, the tokens scored per second against
plain transformers' float32 forward of the same pruned model in the same run (the float32
parent after each generation, on the calibration windows), what 150
generations would take, the teacher's memory, and its agreement with float32 on the same
candidates: the Spearman rank correlation of the first stage's offspring fitness (mean over
generations), and in how many generations the same first-stage survivors and the same next
parent were selected:

    bfloat16-top256: generation_s: 76.0  generation_cpu_s: 75.2  tokens_per_s: 134
      x_transformers: 1.11 (by CPU time 1.11)
      search_150_min: 190.0 (by CPU time over 2 threads: 94.0)  x_float32: 1.51 (by CPU
      time 1.28)  teacher_mb: 8  spearman: 0.987 (min 0.985)  same_survivors: 1/2
      same_parent: 2/2

(SmolLM2-135M on 2 cores shared with other work: the clock and the CPU time both inflated.)

A way over least-squares levels also prints what its levels cost: the levels solved and
reused, the bytes their re-fits held at most (the cache's bound is 1 GiB), the seconds spent
solving, and one level's solve at the uniform width timed alone (its float64 GFLOP/s, the rate
``geospec validate`` assumes). With ``--sequential-check``, each generation's first-stage
offspring of the first least-squares way are also scored with every layer re-fitted from
scratch the sequential way (``sequential_refits`` on the candidate itself, then a full pass):
the rank correlation with the one-pass levels and whether the same survivors would go on
(``--sequential-candidates`` of them: each costs a walk of the model over the windows).

``--levels-only`` runs no search (a minute, where the search takes many): it times the moments'
one pass, plain transformers' float32 forward on the same windows, and one level's solve at the
uniform width in every layer, then replays ``--generations`` generations of the search with the
real mutations and stages on a stand-in fitness, the squared distance in levels to
``--toward`` (comma-separated widths: where a real search went) plus noise (``--noise``, in
squared levels), counting the levels its candidates visit: distinct, new per generation, and
what their re-fits would hold. New levels x the solve's seconds is what repaired levels add to a
generation, an estimate beside the float32 generation's measured seconds.

A generation scores ``offspring x stage 1 + (survivors + parent) x later stages`` tokens (the
defaults: about 10k); size the stages from that and from the fitness's noise.
"""

from __future__ import annotations

import argparse
import gzip
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from geospec.engine.precision import computing
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.cut import pruned
from geospec.prune.evolve import Evolution
from geospec.prune.losses import eval_loss
from geospec.prune.repair import calibration_moments, layer_refit, sequential_refits
from geospec.prune.score import calibration_windows, neuron_scores
from geospec.prune.search import (
    CalibrationFitness,
    RepairedLevels,
    calibration_batches,
    next_token_kl,
)
from geospec.shapes.pruned import pruned_dims
from geospec.shapes.repair import LEVEL_CACHE_BYTES, level_operations


def model_of(gguf: str | None, tiny: bool) -> torch.nn.Module:
    import transformers as hf

    if gguf:
        path = Path(gguf)
        return hf.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
    torch.manual_seed(0)
    shape = (
        {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 4}
        if tiny
        else {
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
        }
    )
    config = hf.LlamaConfig(
        num_attention_heads=4 if tiny else 9,
        num_key_value_heads=2 if tiny else 3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        **shape,
    )
    return hf.LlamaForCausalLM(config).eval()


def text_of(gguf: str | None, vocab: int, count: int) -> np.ndarray:
    """``count`` tokens: the start of bundled Austen in the GGUF's tokenizer, or random ones."""
    if not gguf:
        return np.random.default_rng(0).integers(0, vocab, count)
    import transformers as hf

    from geospec.engine.corpus import bundled_path

    path = Path(gguf)
    tokenizer = hf.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    with gzip.open(bundled_path("austen"), "rt", encoding="utf-8") as file:
        text = file.read()
    return np.asarray(tokenizer(text[: len(text) // 10])["input_ids"][:count])


class Recorded:
    """A fitness that keeps what it was asked (each call's candidates and values) and counts
    the seconds and tokens it scored."""

    def __init__(self, fitness: CalibrationFitness) -> None:
        self.fitness = fitness
        self.windows, self.window_tokens = fitness.windows, fitness.window_tokens
        self.calls: list[tuple[list[list[int]], list[float], list[int]]] = []
        self.seconds, self.tokens = 0.0, 0

    def __call__(
        self,
        candidates: Sequence[Sequence[int]],
        windows: Sequence[int],
        base: Sequence[int] | None = None,
    ) -> list[float]:
        started = time.perf_counter()
        values = self.fitness(candidates, windows, base)
        self.seconds += time.perf_counter() - started
        self.tokens += len(candidates) * len(windows) * self.window_tokens
        self.calls.append(([list(c) for c in candidates], values, sorted(windows)))
        return values


def way_of(name: str) -> tuple[str, int | None, str | None]:
    """``<dtype>[-top<K>][-lstsq|-mean]`` as (dtype, K, the levels' repair)."""
    import re

    found = re.fullmatch(r"(float32|bfloat16)(?:-top(\d+))?(?:-(lstsq|mean))?", name)
    if found is None:
        raise SystemExit(
            f"--ways: {name!r}: a way is float32 or bfloat16, then -top<K>, then -lstsq or -mean "
            "(each optional)"
        )
    dtype, top, levels = found.groups()
    return dtype, int(top) if top else None, levels


def sequential_kl(
    model: torch.nn.Module,
    sites: Sequence[Any],
    orders: Sequence[Sequence[int]],
    batches: Sequence[Any],
    widths: Sequence[int],
    rows: Sequence[int],
    teacher: dict[Any, torch.Tensor],
    damping: float,
) -> float:
    """The mean per-token KL on calibration windows ``rows`` of the model pruned to ``widths``
    and re-fitted from scratch the sequential way (every layer on the pruned and repaired
    model's own inputs, over every calibration window)."""
    refits = sequential_refits(model, sites, batches, orders, widths, damping)
    inputs = torch.cat([x for x, _ in batches])[list(rows)]
    with torch.no_grad(), pruned(sites, orders, widths, refits=refits):
        total = sum(
            float(next_token_kl(model, inputs[i : i + 1], teacher[row].unsqueeze(0)))
            for i, row in enumerate(rows)
        )
    return total / (len(rows) * inputs.shape[1])


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", help="SmolLM2-135M's GGUF file (default: random weights)")
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama (checks the script)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--windows", type=int, default=16, help="calibration windows")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--generations", type=int, default=3)
    parser.add_argument("--offspring", type=int, default=16)
    parser.add_argument(
        "--stages", default="256:2,2048:1", help="tokens:survivors per stage (the defaults)"
    )
    parser.add_argument(
        "--ways",
        default="float32,bfloat16,bfloat16-top256",
        help="how candidates are scored, the first the reference (float32, bfloat16, "
        "<dtype>-top<K>)",
    )
    parser.add_argument("--cut", default="true", help="true widths or zeroed activations")
    parser.add_argument("--seed", type=int, default=0, help="the search's seed (its draws)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (2: both cores)")
    parser.add_argument("--damping", type=float, default=0.1, help="the least-squares levels'")
    parser.add_argument(
        "--sequential-check",
        action="store_true",
        help="score the first least-squares way's first-stage offspring re-fitted sequentially",
    )
    parser.add_argument(
        "--sequential-candidates", type=int, default=8, help="how many of them (a walk each)"
    )
    parser.add_argument("--levels-only", action="store_true", help="solves and a replay, no search")
    parser.add_argument("--toward", help="--levels-only: the widths the replay walks towards")
    parser.add_argument("--noise", type=float, default=4.0, help="--levels-only: the fitness's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = model_of(args.gguf, args.tiny)
    config = model.config
    layers, d_model = config.num_hidden_layers, config.hidden_size
    width, multiple = config.intermediate_size, 8 if args.tiny else 64
    tokens = text_of(args.gguf, config.vocab_size, (args.windows + 1) * 600)
    starts = calibration_windows(tokens, args.seq_len, args.windows, 0)
    batches = calibration_batches(
        tokens, starts, args.seq_len, args.batch_size, torch.device("cpu")
    )
    sites = find_ffn_sites(model, d_model, lambda: logits_of(model, batches[0][0][:1]))
    importance = create_plugin("importance", {"kind": "activation"})
    _, orders = neuron_scores(
        model, sites, importance, tokens, starts, args.seq_len, args.batch_size
    )
    dims = pruned_dims(layers, d_model, width, multiple, args.keep, "swiglu")
    stages = [
        {"tokens": int(t), "survivors": int(s)}
        for t, s in (stage.split(":") for stage in args.stages.split(","))
    ]
    table = {"kind": "evolve", "offspring": args.offspring, "stages": stages, "seed": args.seed}
    schedule = create_plugin("schedule", table)
    if args.levels_only:
        levels_only(args, model, sites, orders, batches, dims, Evolution(schedule.params))
        return
    ways = args.ways.split(",")
    print(
        f"{args.gguf or ('a tiny Llama' if args.tiny else 'random weights, SmolLM2 shape')}: "
        f"{args.windows} calibration windows of {args.seq_len}; keep {args.keep}; "
        f"{args.generations} generations of {args.offspring} offspring, stages {stages}; "
        f"ways {ways} (the first the reference); {torch.get_num_threads()} threads",
        flush=True,
    )
    scorers: dict[str, Recorded] = {}
    teacher_mb: dict[str, float] = {}
    repaired: dict[str, RepairedLevels] = {}
    moments, moments_s = None, 0.0
    for name in ways:
        dtype, top_k, repair = way_of(name)
        teacher: dict[Any, torch.Tensor] = {}
        if repair is not None and moments is None:  # one pass of the unpruned model, shared
            started = time.perf_counter()
            moments = calibration_moments(model, sites, batches)
            moments_s = time.perf_counter() - started
        if repair == "lstsq":
            repaired[name] = RepairedLevels(sites, orders, moments=moments, damping=args.damping)
        elif repair == "mean":
            assert moments is not None
            repaired[name] = RepairedLevels(sites, orders, means=[m.mean for m in moments])
        scorer = CalibrationFitness(
            model, sites, orders, batches, "kl", args.batch_size, teacher, args.cut, top_k,
            levels=repaired.get(name),
        )  # fmt: skip
        with computing(dtype, "cpu"):
            scorer.prepare(range(scorer.windows))
        teacher_mb[name] = sum(t.numel() * t.element_size() for t in teacher.values()) / 2**20
        scorers[name] = Recorded(scorer)
    first = scorers[ways[0]]
    evolution = Evolution(schedule.params)
    draws = evolution.stage_windows(first)
    levels = evolution.levels(dims, width)
    parent = list(create_plugin("schedule", {"kind": "uniform"}).widths_from(dims, {}, {}))
    steps: dict[str, list[dict[str, Any]]] = {name: [] for name in ways}
    seconds, cpu = dict.fromkeys(ways, 0.0), dict.fromkeys(ways, 0.0)
    plain, plain_cpu = {"float32": 0.0, "bfloat16": 0.0}, {"float32": 0.0, "bfloat16": 0.0}
    for generation in range(args.generations):
        for name in ways:
            dtype, _, _ = way_of(name)
            before = len(scorers[name].calls)
            started, used = time.perf_counter(), time.process_time()
            with computing(dtype, "cpu"):
                step = evolution.generation(parent, generation, scorers[name], draws, levels)
            seconds[name] += time.perf_counter() - started
            cpu[name] += time.process_time() - used
            step["calls"] = scorers[name].calls[before:]
            steps[name].append(step)
            print(
                f"generation {generation + 1} {name}: fitness {step['fitness']:.5g}, "
                f"accepted {step['accepted']}, {time.perf_counter() - started:.1f} s",
                flush=True,
            )
        parent = steps[ways[0]][-1]["widths"]
        # plain transformers' forward of the model at the new parent's true widths, on the
        # calibration batches, after every generation (the machine's load changes as it goes)
        for dtype in ("float32", "bfloat16"):
            with torch.no_grad(), pruned(sites, orders, parent), computing(dtype, "cpu"):
                started, used = time.perf_counter(), time.process_time()
                eval_loss(model, batches)
                plain[dtype] += time.perf_counter() - started
                plain_cpu[dtype] += time.process_time() - used
    plain_tokens = args.generations * sum(targets.numel() for _, targets in batches)
    threads = torch.get_num_threads()
    print(
        f"plain transformers forward: float32 {plain_tokens / plain['float32']:.0f} tokens/s "
        f"({plain_tokens / plain_cpu['float32'] * threads:.0f} by CPU time), bfloat16 autocast "
        f"{plain_tokens / plain['bfloat16']:.0f} tokens/s "
        f"({plain_tokens / plain_cpu['bfloat16'] * threads:.0f} by CPU time)"
    )
    for name in ways:
        # by CPU time as well as by the clock: other processes on the cores slow the clock,
        # not the CPU seconds (threads x the clock on idle cores, at best)
        generation_s, generation_cpu = (
            seconds[name] / args.generations,
            cpu[name] / args.generations,
        )
        rate = scorers[name].tokens / seconds[name]
        line = (
            f"{name}: generation_s: {generation_s:.1f}  generation_cpu_s: {generation_cpu:.1f}  "
            f"tokens_per_s: {rate:.0f}  x_transformers: "
            f"{rate / (plain_tokens / plain['float32']):.2f} (by CPU time "
            f"{scorers[name].tokens / cpu[name] / (plain_tokens / plain_cpu['float32']):.2f})"
        )
        agreement = [
            f"search_150_min: {150 * generation_s / 60:.1f} "
            f"(by CPU time over {threads} threads: {150 * generation_cpu / threads / 60:.1f})",
            f"x_{ways[0]}: {seconds[ways[0]] / seconds[name]:.2f} (by CPU time "
            f"{cpu[ways[0]] / cpu[name]:.2f})",
            f"teacher_mb: {teacher_mb[name]:.0f}",
        ]
        if name != ways[0]:
            pairs = list(zip(steps[ways[0]], steps[name], strict=True))
            rho = [spearman(a["calls"][0][1], b["calls"][0][1]) for a, b in pairs]
            # over repaired levels the scores differ from the cut's by design: the agreement
            # says how far repair changes the search's choices, not an approximation's error
            survivors = sum(
                sorted(a["calls"][1][0]) == sorted(b["calls"][1][0]) if len(a["calls"]) > 1 else 1
                for a, b in pairs
            )
            same = sum(a["widths"] == b["widths"] for a, b in pairs)
            agreement += [
                f"spearman: {np.mean(rho):.3f} (min {min(rho):.3f})",
                f"same_survivors: {survivors}/{len(pairs)}",
                f"same_parent: {same}/{len(pairs)}",
            ]
        print(line + "\n  " + "  ".join(agreement))
        if name in repaired:
            print("  " + levels_line(repaired[name], moments_s))
    if repaired and moments is not None:
        kept = dims.ffn_width
        solve_s = timed_solve(sites[0].ffn, moments[0], orders[0], kept, args.damping)
        rate = level_operations(width, d_model, kept) / solve_s
        print(
            f"one level's solve at {kept} of {width} neurons: {solve_s * 1000:.0f} ms "
            f"({rate / 1e9:.1f} GFLOP/s float64); the cache's bound "
            f"{LEVEL_CACHE_BYTES / 2**20:.0f} MiB"
        )
    lstsq = [name for name in ways if way_of(name)[2] == "lstsq"]
    if args.sequential_check and lstsq:
        sequential_check(args, model, sites, orders, batches, scorers[lstsq[0]], steps[lstsq[0]])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak_rss_gb: {peak:.2f}")


class Toward:
    """A stand-in fitness: the squared distance in levels of ``step`` neurons from ``target``,
    plus noise of variance ``noise`` drawn per candidate and call (as fresh windows move a real
    fitness); it records every candidate it is asked about."""

    def __init__(
        self, target: Sequence[int], step: int, noise: float, windows: int, window_tokens: int
    ) -> None:
        self.target, self.step, self.noise = list(target), step, noise
        self.windows, self.window_tokens = windows, window_tokens
        self.rng = np.random.default_rng(0)
        self.asked: list[list[int]] = []

    def __call__(
        self,
        candidates: Sequence[Sequence[int]],
        windows: Sequence[int],
        base: Sequence[int] | None = None,
    ) -> list[float]:
        self.asked += [list(c) for c in candidates]
        return [
            sum(((w - t) / self.step) ** 2 for w, t in zip(c, self.target, strict=True))
            + float(self.rng.normal(0, self.noise**0.5))
            for c in candidates
        ]


def levels_only(
    args: argparse.Namespace,
    model: torch.nn.Module,
    sites: Sequence[Any],
    orders: Sequence[Sequence[int]],
    batches: Sequence[Any],
    dims: Any,
    evolution: Evolution,
) -> None:
    """The costs of repaired levels without a search: the moments' pass, plain forward, one
    solve per layer, and the levels a replayed search visits (the module docstring)."""
    config = model.config
    width, d_model = config.intermediate_size, config.hidden_size
    started = time.perf_counter()
    moments = calibration_moments(model, sites, batches)
    moments_s = time.perf_counter() - started
    tokens = sum(targets.numel() for _, targets in batches)
    with torch.no_grad():
        started = time.perf_counter()
        eval_loss(model, batches)
        forward = tokens / (time.perf_counter() - started)
    kept = dims.ffn_width
    solves = [
        timed_solve(site.ffn, found, order, kept, args.damping)
        for site, found, order in zip(sites, moments, orders, strict=True)
    ]
    solve_s = float(np.median(solves))
    rate = level_operations(width, d_model, kept) / solve_s
    print(
        f"moments_s: {moments_s:.1f} (one pass over {tokens} tokens)  plain transformers "
        f"forward: {forward:.0f} tokens/s\nsolve at {kept} of {width} neurons: median "
        f"{solve_s * 1000:.0f} ms, max {max(solves) * 1000:.0f} ms over {len(solves)} layers "
        f"({rate / 1e9:.1f} GFLOP/s float64; {solve_s * forward:.0f} tokens of plain forward)",
        flush=True,
    )
    low, high, size = evolution.levels(dims, width)
    uniform = [kept] * len(sites)
    target = [int(w) for w in args.toward.split(",")] if args.toward else uniform
    # as many windows as every stage may draw: the replay scores none of them
    fitness = Toward(target, size, args.noise, 10_000, args.seq_len - 1)
    draws = evolution.stage_windows(fitness)
    parent, seen, new, accepted = uniform, set(), [], 0
    for generation in range(args.generations):
        before = len(fitness.asked)
        step = evolution.generation(parent, generation, fitness, draws, (low, high, size))
        visited = {
            (layer, w) for c in fitness.asked[before:] for layer, w in enumerate(c) if w < width
        }
        new.append(len(visited - seen))
        seen |= visited
        accepted += step["accepted"]
        parent = step["widths"]
    held = sum(4 * d_model * w + 8 * d_model for _, w in seen)
    moved = sum(abs(a - b) for a, b in zip(parent, target, strict=True)) // size
    per_layer: dict[int, int] = {}
    for layer, _ in seen:
        per_layer[layer] = per_layer.get(layer, 0) + 1
    widest = max(per_layer.values(), default=0)
    towards = "--toward" if args.toward else "uniform"
    print(
        f"replay of {args.generations} generations towards {towards} (noise {args.noise:g}): "
        f"{accepted} accepted, {moved} levels from the target at the "
        f"end; {len(seen)} distinct levels ({len(seen) / len(sites):.1f} a layer, at most "
        f"{widest} in one), all kept: {held / 2**20:.0f} MiB (bound "
        f"{LEVEL_CACHE_BYTES / 2**20:.0f} MiB)\nnew levels a generation: first {new[0]}, "
        f"2-10 {np.mean(new[1:10]):.1f}, 11-{args.generations} {np.mean(new[10:]):.1f}; "
        f"solving them adds {new[0] * solve_s:.1f} s to the first generation, "
        f"{np.mean(new[1:10]) * solve_s:.1f} s to each of 2-10, "
        f"{np.mean(new[10:]) * solve_s:.2f} s to each later one; "
        f"{len(seen) * solve_s / 60:.1f} min in all"
    )


def levels_line(found: RepairedLevels, moments_s: float) -> str:
    """What a way's repaired levels cost."""
    return (
        f"levels: {found.describe()}; solved: {found.solved}  reused: {found.reused}  "
        f"held_mb: {found.held / 2**20:.0f}  peak_mb: {found.peak / 2**20:.0f}  "
        f"solve_s: {found.seconds:.1f}  moments_s: {moments_s:.1f} (one pass, shared)"
    )


def timed_solve(
    ffn: torch.nn.Module, moments: Any, order: Sequence[int], kept: int, damping: float
) -> float:
    """The best of three solves of one level at ``kept`` neurons, in seconds."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        layer_refit(ffn, moments, sorted(order[:kept]), damping)
        best = min(best, time.perf_counter() - started)
    return best


def sequential_check(
    args: argparse.Namespace,
    model: torch.nn.Module,
    sites: Sequence[Any],
    orders: Sequence[Sequence[int]],
    batches: Sequence[Any],
    scorer: Recorded,
    steps: Sequence[dict[str, Any]],
) -> None:
    """Each generation's first-stage offspring (the first ``--sequential-candidates``) scored
    with the sequential re-fit from scratch, against their one-pass levels' fitness: rank
    correlation, the same survivors among them, the same best."""
    teacher = scorer.fitness.teacher
    survivors = int(args.stages.split(",")[0].split(":")[1])
    rho, same, best, started = [], 0, 0, time.perf_counter()
    for step in steps:
        candidates, one_pass, rows = step["calls"][0]
        candidates = candidates[: args.sequential_candidates]
        one_pass = one_pass[: args.sequential_candidates]
        walked = [
            sequential_kl(model, sites, orders, batches, c, rows, teacher, args.damping)
            for c in candidates
        ]
        rho.append(spearman(one_pass, walked))
        top = sorted(range(len(candidates)), key=one_pass.__getitem__)
        top_walked = sorted(range(len(candidates)), key=walked.__getitem__)
        same += sorted(top[:survivors]) == sorted(top_walked[:survivors])
        best += top[0] == top_walked[0]
    print(
        f"sequential re-fit from scratch vs one-pass levels, the first "
        f"{args.sequential_candidates} offspring of the first stage of {len(steps)} "
        f"generations: spearman {np.mean(rho):.3f} (min {min(rho):.3f}); same survivors "
        f"{same}/{len(steps)}; same best {best}/{len(steps)} "
        f"({time.perf_counter() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
