"""Pruning as table rows, from prune.json, and the report.md section: per budget, every arm's
widths, FFN parameters (equal within one multiple per layer: checked), perplexity on each eval
corpus, and its paired difference in loss from the baseline over the calibration seeds; with
``[eval]``, every lm-eval metric of the pruned models (the units' eval.json:
:func:`with_unit_scores`) compared with the baseline the same way."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from geospec.report.diagnostics import number
from geospec.stats import holm

#: The level the prune's tables are read at (its intervals are 95%).
ALPHA = 0.05


def corpus_labels(corpora: Sequence[str]) -> dict[str, str]:
    """How the report names each eval corpus: a file by its name (an absolute path says where
    one machine kept it, not what it is), the whole path where two files share a name; a
    ``bundled:`` corpus as it is."""
    names = [corpus if corpus.startswith("bundled:") else Path(corpus).name for corpus in corpora]
    return {
        corpus: name if names.count(name) == 1 else corpus
        for corpus, name in zip(corpora, names, strict=True)
    }


def unchosen_settings(budget: Mapping[str, Any]) -> set[str]:
    """The arms of a keep fraction that are a sweep's settings (OWL's grid) other than the one
    its calibration loss chose: what a table or plot of the arms a user could pick leaves out."""
    sweeps = budget.get("sweeps", {}).values()
    return {name for found in sweeps for name in found["calibration_loss"]} - {
        found["best"] for found in sweeps
    }


def total_parameters(prune: Mapping[str, Any], ffn: int) -> int | None:
    """An arm's parameters in all (the unpruned model's less the FFN parameters cut), from
    prune.json's ``parameters`` (None in a record from before it was kept)."""
    found = prune.get("parameters")
    if not found:
        return None
    return int(found["total"]) - int(found["ffn"]) + ffn


def budget_rows(
    prune: Mapping[str, Any],
    budget: Mapping[str, Any],
    pairs: Sequence[tuple[str, str]] | None = None,
) -> list[list[str]]:
    """One row per arm and corpus (and per corpus after healing, where the models were healed);
    every difference is from the baseline's loss measured the same way. ``pairs`` (``[arm,
    against]``): those comparisons instead, one row per pair and corpus. Where the units
    recorded each eval window's loss, the difference also gets a bootstrap over seeds and
    windows, its p Holm-adjusted across the table's rows."""
    from geospec.stats import summarize

    baseline = prune["baseline"]
    chosen = pairs if pairs is not None else [(name, baseline) for name in budget["arms"]]
    rows: list[list[str]] = []
    p_values: dict[str, float | None] = {}
    labels = corpus_labels(list(prune.get("corpora", [])))
    for name, against in chosen:
        arm = budget["arms"][name]
        widths = next(iter(arm["widths"].values()))
        varies = len({tuple(w) for w in arm["widths"].values()}) > 1
        shown = " ".join(str(w) for w in widths) + (" (seed 0; varies)" if varies else "")
        params = "/".join(f"{p:,}" for p in sorted(set(arm["ffn_params"].values())))
        if pairs is not None:
            shown, params = f"vs {against}", ""
        measured = [("loss", corpus) for corpus in arm["loss"]]
        measured += [("healed_loss", corpus) for corpus in arm.get("healed_loss", {})]
        for field, corpus in measured:
            values = [float(v) for v in arm[field][corpus].values()]
            named = labels.get(corpus, corpus)
            label = named if field == "loss" else f"{named}, healed"
            row = [name, shown, params, label, number(math.exp(summarize(values).mean), 2)]
            shown, params = "", ""  # once per arm
            if name == against:
                rows.append([*row, "-", "-", "-", "-", "-", "-"])
                continue
            cells, p = _difference(arm, budget["arms"][against], field, corpus)
            p_values[str(len(rows))] = p
            rows.append([*row, *cells, "-"])
    for index, adjusted in holm(p_values).items():
        if adjusted is not None:
            rows[int(index)][-1] = f"{adjusted:.3g}"
    return rows


def _difference(
    arm: Mapping[str, Any], against: Mapping[str, Any], field: str, corpus: str
) -> tuple[list[str], float | None]:
    """The cells of one comparison (the mean paired difference, its t interval over seeds, the
    seeds it is better on, the sign-flip p, the interval over seeds and windows) and the
    bootstrap's p (None without window losses)."""
    from geospec.stats import (
        crossed_bootstrap,
        paired_difference,
        shows_interval,
        shows_sign_flip,
        sign_flip_p,
    )

    ours, theirs = values_by(arm[field][corpus]), values_by(against[field][corpus])
    diff = paired_difference(ours, theirs)
    flip = sign_flip_p([ours[s] - theirs[s] for s in diff.seeds])
    if not shows_sign_flip(diff.n, ALPHA):
        flip = None  # the test cannot reach the level: a p of 1 is no evidence either way
    shown = shows_interval(diff.n) and not math.isnan(diff.ci[0])
    ci = f"[{diff.ci[0]:+.4f}, {diff.ci[1]:+.4f}]" if shown else "-"
    crossed, p = "-", None
    windows = "window_loss" if field == "loss" else None
    if windows and windows in arm and windows in against and diff.seeds:
        table = [
            [a - b for a, b in zip(arm[windows][corpus][str(s)],
                                   against[windows][corpus][str(s)], strict=True)]
            for s in diff.seeds
        ]  # fmt: skip
        found = crossed_bootstrap(table)
        crossed, p = f"[{found.ci[0]:+.4f}, {found.ci[1]:+.4f}]", found.p
    cells = [
        f"{diff.mean:+.4f}", ci, f"{diff.improved}/{diff.n}",
        "-" if flip is None else f"{flip:.3g}", crossed,
    ]  # fmt: skip
    return cells, p


def values_by(losses: Mapping[str, float]) -> dict[int, float]:
    return {int(s): float(v) for s, v in losses.items()}


def with_unit_scores(prune: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """prune.json's content with every scored unit's lm-eval metrics (its intact eval.json that
    scores the unit there now: :func:`geospec.prune.evaluation.read_unit_scores`): per budget
    and arm ``"eval": {"<task>/<metric>": {"<seed>": value}}``, and ``"eval"`` at the top
    (``metrics``, ``higher_is_better`` per metric, ``lm_eval`` versions, ``samples`` per task)
    when any unit is scored. Without scores, the record unchanged."""
    from geospec.prune.evaluation import read_unit_scores
    from geospec.report.evaluation import add_scores
    from geospec.rundir.layout import prune_unit_dir

    found = dict(prune)
    higher: dict[str, bool | None] = {}
    versions: set[str] = set()
    samples: dict[str, Any] = {}
    budgets = []
    for budget in prune["budgets"]:
        arms = {}
        for name, arm in budget["arms"].items():
            values: dict[str, dict[str, float]] = {}
            for seed in prune["seeds"]:
                record = read_unit_scores(prune_unit_dir(run_dir, budget["keep"], name, seed))
                if record is not None:
                    add_scores(record, str(seed), values, higher, versions, samples)
            arms[name] = {**arm, "eval": values} if values else dict(arm)
        budgets.append({**budget, "arms": arms})
    if not higher:
        return found
    found["budgets"] = budgets
    found["eval"] = {
        "metrics": sorted(higher),
        "higher_is_better": higher,
        "lm_eval": sorted(versions),
        "samples": samples,
    }
    return found


def eval_rows(prune: Mapping[str, Any], budget: Mapping[str, Any]) -> list[list[str]]:
    """One row per lm-eval metric and arm at one budget: the mean over the calibration seeds,
    and the paired difference from the baseline's score on the same seeds as the loss's (mean,
    t interval, the seeds it is better on in the metric's direction, the exact sign-flip p),
    that p Holm-adjusted across the arms of each metric."""
    from geospec.report.evaluation import improved_seeds
    from geospec.stats import paired_difference, sign_flip_p, summarize

    evaluation = prune["eval"]
    baseline = budget["arms"][prune["baseline"]].get("eval", {})
    rows: list[list[str]] = []
    for label in evaluation["metrics"]:
        higher = evaluation["higher_is_better"].get(label)
        arrow = "" if higher is None else (" ↑" if higher else " ↓")
        p_values: dict[str, float | None] = {}
        first = len(rows)
        for name, arm in budget["arms"].items():
            ours = values_by(arm.get("eval", {}).get(label, {}))
            if not ours:
                rows.append([f"{label}{arrow}", name, "(not evaluated)", *["-"] * 5])
                continue
            mean = summarize(list(ours.values())).mean
            row = [f"{label}{arrow}", name, f"{mean:.4g}"]
            theirs = values_by(baseline.get(label, {}))
            if name == prune["baseline"] or not theirs:
                rows.append([*row, *["-"] * 5])
                continue
            diff = paired_difference(ours, theirs)
            flip = sign_flip_p([ours[s] - theirs[s] for s in diff.seeds])
            ci = "-" if math.isnan(diff.ci[0]) else f"[{diff.ci[0]:+.4g}, {diff.ci[1]:+.4g}]"
            better = improved_seeds(ours, theirs, higher)
            p_values[str(len(rows))] = flip
            rows.append(
                [
                    *row,
                    f"{diff.mean:+.4g}",
                    ci,
                    "-" if better is None else f"{better}/{diff.n}",
                    "-" if flip is None else f"{flip:.3g}",
                    "-",
                ]
            )
        for index, adjusted in holm(p_values).items():
            if adjusted is not None and int(index) >= first:
                rows[int(index)][-1] = f"{adjusted:.3g}"
    return rows


EVAL_HEADERS = [
    "metric",
    "arm",
    "score (mean over seeds)",
    "Δ vs baseline",
    "95% CI",
    "better",
    "p (sign-flip)",
    "p (Holm)",
]


HEADERS = [
    "arm",
    "widths",
    "FFN params",
    "corpus",
    "perplexity",
    "Δ loss vs baseline",
    "95% CI",
    "better",
    "p (sign-flip)",
    "95% CI (seeds x windows)",
    "p (Holm)",
]


def params_problem(prune: Mapping[str, Any], budget: Mapping[str, Any]) -> str | None:
    """Arms whose FFN parameter counts differ by more than one multiple per layer."""
    counts = {
        name: value for name, arm in budget["arms"].items() for value in arm["ffn_params"].values()
    }
    spread = max(counts.values()) - min(counts.values())
    per_neuron = max(counts.values()) // max(1, budget["budget"])
    limit = prune["layers"] * budget["multiple"] * max(1, per_neuron)
    if spread > limit:
        return f"FFN parameters differ by {spread:,} (more than one multiple per layer)"
    return None


#: A recommended model whose perplexity on the selection windows is this many times the
#: unpruned model's is said to need healing before use: SmolLM2-135M cut to 1/2 of its FFN
#: neurons (2.3-4x on the eval corpora) answers "The capital of France is" with "la la la",
#: Qwen2.5-Coder-0.5B (2.3x) with "a capital of France, a capital ...". Below it the ratio does
#: not decide (SmolLM2 at 3/4, 1.3-1.8x, still says Paris; Qwen at 3/4, 1.35x, says "F."): the
#: report points to the continuations (docs/prune.md, "What to ship").
NEEDS_HEALING = 2.0


def what_to_ship(prune: Mapping[str, Any]) -> list[str]:
    """The report's "What to ship" lines (markdown), or none where nothing was recommended."""
    from geospec.prune.shipped import gguf_file_name

    budgets = [budget for budget in prune["budgets"] if "recommended" in budget]
    if not budgets:
        return []
    first = budgets[0]["recommended"]
    labels = corpus_labels(list(prune.get("corpora", [])))
    lines = [
        "## What to ship",
        "",
        f"Per keep fraction, the arm with the lowest mean loss on the last {first['windows']} "
        f"windows of the calibration corpus's validation split (prune.select), over "
        f"{first['seeds']} calibration seed(s): windows no width-setting stage reads and no eval "
        "window overlaps, so no eval text chose it. The perplexities are the eval's, shown, "
        "not used (the unpruned model's in parentheses); the margin is the paired difference "
        "from the next arm on the selection windows, with its 95% bootstrap interval over "
        "seeds x windows. Below each, what the model ships as, measured before anything is "
        "exported: its true-width safetensors and, from a GGUF reference, the GGUF file the "
        "command writes (what its FFN matrices are stored as, its own weights scored on the "
        "selection windows beside the float32 model's) and its llama.cpp speed (best and "
        "median, with the machine's load), against the source file's." + _chosen_on(first),
        "",
    ]
    for budget in budgets:
        chosen = budget["recommended"]
        arm = budget["arms"][chosen["arm"]]
        perplexity = ", ".join(
            f"{labels.get(corpus, corpus)} {math.exp(fmean(float(v) for v in losses.values())):.2f}"
            + (f" ({math.exp(prune['reference'][corpus]):.2f})" if corpus in prune["reference"]
               else "")
            for corpus, losses in arm["loss"].items()
        )  # fmt: skip
        ffn = sorted(set(arm["ffn_params"].values()))[0]
        total = total_parameters(prune, ffn)
        sized = f"{ffn:,} FFN parameters"
        if total is not None:
            unpruned = int(prune["parameters"]["total"])
            sized = (
                f"{total:,} parameters ({total / unpruned:.2f}x the unpruned {unpruned:,}; "
                f"{ffn:,} in FFNs)"
            )
        low, high = chosen["margin_ci"]
        lines.append(
            f"- keep {budget['keep']:g}: **{chosen['arm']}**, {chosen['margin']:.4f} nats "
            f"[{low:+.4f}, {high:+.4f}] below {chosen['next']} on the selection windows; "
            f"perplexity {perplexity}; {sized}{_healing(prune, budget['keep'], chosen)}; "
            f"`geospec prune SPEC --export best@{budget['keep']:g} --format gguf --to "
            f"{gguf_file_name(chosen['arm'], budget['keep'])}`"
        )
        if "shipped" in chosen:
            lines.append(f"  - {shipped_line(chosen['shipped'])}")
    return [*lines, "", *_continuations(prune)]


def _chosen_on(recommended: Mapping[str, Any]) -> str:
    """What the recommendation read, where prune.select.shipped asked for the GGUF files."""
    on = recommended.get("on")
    if on is None:
        return ""
    if on == "shipped":
        return (
            " The losses that chose are each arm's GGUF file's, its de-quantized weights "
            "(prune.select.shipped), not its float32 model's."
        )
    return (
        f" prune.select.shipped asked for the GGUF files' losses, but the float32 models' "
        f"chose ({on})."
    )


def shipped_line(shipped: Mapping[str, Any]) -> str:
    """What a recommended model ships as (prune.json's ``recommended.shipped``), in one line:
    its safetensors, its GGUF file against the source's and what its matrices are stored as,
    the file's score beside the float32 model's, its llama.cpp speed against the source's (best
    and median, with the machine's load), or why a piece is missing. Records from before a piece
    was measured leave it out."""
    from geospec.prune.shipped import NO_GGUF, NO_GGUF_SCORE
    from geospec.storage.disk import size

    dtype = shipped.get("export_dtype")
    if shipped.get("unexportable"):
        return f"as files: none written ({shipped['unexportable']})"
    parts = [
        f"as files (calibration seed {shipped['seed']}'s cut): safetensors "
        f"{size(int(shipped['safetensors_bytes']))}" + (f" ({dtype})" if dtype else "")
    ]
    gguf, speed = shipped["gguf"], shipped["speed"]
    if "skipped" in gguf:
        untimed = "skipped" in speed and speed["skipped"] == NO_GGUF
        parts.append(
            f"{'no GGUF size or llama.cpp speed' if untimed else 'no GGUF size'} "
            f"({gguf['skipped']})"
        )
    else:
        against = ""
        if gguf.get("source_bytes"):
            ratio = int(gguf["bytes"]) / int(gguf["source_bytes"])
            kind = f" ({gguf['source_type']})" if gguf.get("source_type") else ""
            against = f", {ratio:.2f}x the source's {size(int(gguf['source_bytes']))}{kind}"
        parts.append(f"GGUF ({gguf['type']}) {size(int(gguf['bytes']))}{against}")
        if "ffn_matrices" in gguf:
            parts.append(_stored_words(gguf))
    score = shipped.get("score")
    if isinstance(score, Mapping) and "skipped" not in score:
        difference = float(score["difference"])
        parts.append(
            f"scored as shipped (the GGUF file's weights) {abs(difference):.4f} nats "
            f"{'above' if difference >= 0 else 'below'} the float32 model on the "
            f"{score['windows']} selection windows (perplexity {math.exp(difference):.3f}x)"
        )
    elif isinstance(score, Mapping) and score["skipped"] != NO_GGUF_SCORE:
        parts.append(f"not scored as shipped ({score['skipped']})")
    if "skipped" in speed:
        if speed["skipped"] != NO_GGUF:
            parts.append(f"no llama.cpp speed ({speed['skipped']})")
    else:
        parts.append(_speed_words(speed))
    return "; ".join(parts)


def _share(prune: Mapping[str, Any], budget: Mapping[str, Any]) -> str:
    """The share of the neurons the budget keeps where the width grid moved it from ``keep``
    (Qwen2.5-Coder-1.5B at keep 0.5 on a grid of 256: 0.514)."""
    share = budget["budget"] / (prune["layers"] * prune["width"])
    return f", {share:.3f} on the width grid" if abs(share - budget["keep"]) > 0.0005 else ""


def _stored_words(gguf: Mapping[str, Any]) -> str:
    """What the file's FFN matrices are stored as, and how many fell back for rows that are not
    whole blocks of the file's type."""
    stored = ", ".join(f"{count} {kind}" for kind, count in gguf["ffn_matrices"].items())
    fell = gguf.get("ffn_fallbacks") or {}
    if not fell:
        return f"FFN matrices {stored}, every row in whole blocks"
    fallen = ", ".join(f"{count} to {kind}" for kind, count in fell.items())
    in_source = gguf.get("source_ffn_fallbacks")  # absent: another type, or an older record
    before = "" if in_source is None else f"; the source file's: {sum(in_source.values())}"
    return (
        f"FFN matrices {stored}: {sum(fell.values())} fell back ({fallen}), their rows not whole "
        f"blocks of {gguf['block']}{before}"
    )


def _speed_words(speed: Mapping[str, Any]) -> str:
    """llama.cpp's speed against the source's: best (and median, with the load, where
    recorded)."""
    prompt = float(speed["prompt"]) / float(speed["source_prompt"])
    generation = float(speed["generation"]) / float(speed["source_generation"])
    if "prompt_median" not in speed:  # a record from before the median
        return (
            f"llama.cpp prompt {prompt:.2f}x, generation {generation:.2f}x the source's "
            f"({float(speed['prompt']):,.0f} and {float(speed['generation']):,.1f} tok/s; "
            f"{speed['threads']} threads, best of {speed['rounds']})"
        )
    from geospec.prune.runtime import Load, load_words

    prompt_median = float(speed["prompt_median"]) / float(speed["source_prompt_median"])
    generation_median = float(speed["generation_median"]) / float(speed["source_generation_median"])
    load = None
    if "load" in speed:
        one, five, fifteen = (float(value) for value in speed["load"])
        load = Load(one, five, fifteen, int(speed["cores"]))
    return (
        f"llama.cpp prompt {prompt:.2f}x best, {prompt_median:.2f}x median, generation "
        f"{generation:.2f}x best, {generation_median:.2f}x median the source's "
        f"({float(speed['prompt']):,.0f} and {float(speed['generation']):,.1f} tok/s at best; "
        f"{speed['threads']} threads, {speed['rounds']} rounds; {load_words(load)})"
    )


def heal_command(prune: Mapping[str, Any], keep: float, arm: str) -> str:
    """``geospec heal`` for the model recommended at ``keep``, with what it costs at its
    default steps where prune.json holds the parameters and sequence length (older ones
    do not)."""
    from geospec.prune.shipped import gguf_file_name
    from geospec.shapes.heal_time import DEFAULT_STEPS, healing_time
    from geospec.spec.sections import PruneHeal

    healed = gguf_file_name(arm, keep).removesuffix(".gguf") + "-healed.gguf"
    command = f"`geospec heal SPEC best@{keep:g} --format gguf --to {healed}`"
    budget = next(b for b in prune["budgets"] if b["keep"] == keep)
    ffn = sorted(set(budget["arms"][arm]["ffn_params"].values()))[0]
    pruned = total_parameters(prune, ffn)
    if pruned is None or "seq_len" not in prune:
        return f'{command} (docs/prune.md, "Healing")'
    unpruned = int(prune["parameters"]["total"])
    batch = PruneHeal().batch_size
    took = healing_time(pruned, unpruned, DEFAULT_STEPS, batch, int(prune["seq_len"]), distill=True)
    return f'{command}, {took.describe()} (docs/prune.md, "Healing")'


def _healing(prune: Mapping[str, Any], keep: float, chosen: Mapping[str, Any]) -> str:
    """Whether the recommended model needs healing before use, by its perplexity on the
    selection windows against the unpruned model's (:data:`NEEDS_HEALING`)."""
    reference = prune.get("select_reference")
    if reference is None:
        return ""
    ratio = math.exp(float(chosen["loss"][chosen["arm"]]) - float(reference))
    said = f"; on the selection windows {ratio:.2f}x the unpruned model's perplexity"
    if ratio >= NEEDS_HEALING:
        return said + f": **heal it before use**: {heal_command(prune, keep, chosen['arm'])}"
    # below it the ratio alone does not say: Qwen2.5-Coder-0.5B at 1.35x no longer names Paris
    return said + "; read its continuations below before shipping it unhealed"


def _continuations(prune: Mapping[str, Any]) -> list[str]:
    """The greedy continuations of the fixed prompts, unpruned and per recommended model."""
    found = prune.get("continuations")
    if not found:
        return []
    models = [("unpruned", "reference")] + [
        (f"keep {budget['keep']:g}, {budget['recommended']['arm']}", f"{budget['keep']:g}")
        for budget in prune["budgets"]
        if "recommended" in budget and f"{budget['keep']:g}" in found
    ]
    lines = [
        f"Greedy continuations of fixed prompts ({len(found['prompts'])} prompts, calibration "
        f"seed {found['seed']}'s cut; no decision reads them):",
        "",
    ]
    texts = [(label, found[key]) for label, key in models]
    return [*lines, *continuation_lines(found["prompts"], texts), ""]


def continuation_lines(
    prompts: Sequence[str], models: Sequence[tuple[str, Sequence[str]]]
) -> list[str]:
    """Each prompt, then each model's continuation of it (``models``: a label and the texts, in
    the prompts' order), one line each (What to ship's, and ``geospec heal``'s before and
    after)."""
    lines = []
    for index, prompt in enumerate(prompts):
        lines.append(f"- `{prompt}`")
        for label, texts in models:
            text = " ".join(texts[index].split())  # one line in a table of lines
            lines.append(f"  - {label}: `{text}`")
    return lines


def _seed_notes(seeds: int) -> list[str]:
    """What the table's columns cannot say with this many calibration seeds (empty cells rather
    than figures that read as evidence the design cannot give)."""
    from geospec.stats import MIN_INTERVAL_SEEDS, seeds_to_reach, smallest_sign_flip_p

    notes = []
    if smallest_sign_flip_p(seeds) > ALPHA:
        notes.append(
            f"With {seeds} calibration seed{'s' if seeds > 1 else ''} the sign-flip test over "
            f"seeds cannot give a p below {smallest_sign_flip_p(seeds):.3g} (2/2^{seeds}), so its "
            f"cells are empty (it takes {seeds_to_reach(ALPHA)} seeds to reach p ≤ {ALPHA})"
            + (f", and so are the t intervals (they take {MIN_INTERVAL_SEEDS} seeds)"
               if seeds < MIN_INTERVAL_SEEDS else "")
            + "."
        )  # fmt: skip
    if seeds == 1:
        notes.append(
            "With one calibration seed the bootstrap interval and its Holm p resample the eval "
            "windows only: they say how sure the difference is on this text for this one "
            "calibration sample, not how it would move with another sample."
        )
    return [*notes, ""] if notes else []


def computed_in(prune: Mapping[str, Any]) -> str:
    """What the prune's forward passes computed in (prune.json's ``compute_dtype``; a record
    without one is from before it existed, computed in float32)."""
    dtype = prune.get("compute_dtype", "float32")
    if dtype == "float32":
        return "Computed in float32."
    return (
        f"Computed in {dtype} (prune.compute_dtype): every number here differs from a float32 "
        'computation by up to the rounding docs/prune.md measures ("Compute dtype").'
    )


def prune_markdown(
    prune: Mapping[str, Any],
    images: Sequence[str] = (),
    compare: Sequence[tuple[str, str]] = (),
    *,
    ship: bool = True,
) -> str:
    """The report.md section for prune.json (What to ship, tables, then the plots given);
    ``compare``: further ``[arm, against]`` pairs of its arms (report.compare), a table of their
    own per budget; ``ship``: with What to ship (``geospec prune`` prints it last instead)."""
    from geospec.report.markdown import markdown_table

    importance = prune["importance"]["kind"]
    seeds = len(prune["seeds"])
    calibration = ", ".join(map(str, prune["seeds"]))
    lines = [
        *(what_to_ship(prune) if ship else []),
        "## Pruning the reference",
        "",
        f"The reference ({prune['layers']} layers of {prune['width']} FFN neurons) keeps a share "
        "of its FFN neurons, allocated over layers by each arm; every layer keeps its best "
        f"neurons by the {importance} score of calibration sample k (k = {calibration}; "
        f"arms are paired by it). Perplexity on the first {prune['windows']} validation windows "
        f"of each corpus; Δ loss is the paired difference from {prune['baseline']} over {seeds} "
        "calibration seeds (negative: better), with its t interval over the seeds; where each "
        "eval window's loss is recorded, also a bootstrap interval resampling seeds and eval "
        "windows (crossed: every seed is scored on the same windows), its p Holm-adjusted "
        "across the rows of the table.",
        "",
        *_seed_notes(seeds),
        "Unpruned reference: "
        + ", ".join(
            f"{corpus_labels(list(prune['reference'])).get(c, c)} {math.exp(v):.2f}"
            for c, v in prune["reference"].items()
        )
        + " (perplexity)"
        + (f"; {prune['parameters']['total']:,} parameters." if prune.get("parameters") else "."),
        "",
        computed_in(prune),
        "",
    ]
    for budget in prune["budgets"]:
        lines += [
            f"### Keeping {budget['keep']:g} of the FFN neurons ({budget['budget']:,} of "
            f"{prune['layers'] * prune['width']:,}{_share(prune, budget)}; uniform width "
            f"{budget['uniform_width']})",
            "",
        ]
        problem = params_problem(prune, budget)
        lines += [
            f"**warning:** {problem}" if problem else "Every arm has the same FFN parameters.",
            "",
        ]
        lines += markdown_table(HEADERS, budget_rows(prune, budget))
        if prune.get("eval"):
            evaluation = prune["eval"]
            examples = ", ".join(f"{task} {n}" for task, n in evaluation["samples"].items())
            lines += [
                "Downstream evaluation of the pruned models: each exported model scored by "
                f"lm-evaluation-harness ({', '.join(evaluation['lm_eval']) or '-'}; examples per "
                f"task: {examples}); Δ is the paired difference from {prune['baseline']} over "
                'the calibration seeds, as for the loss (↑: higher is better; "better" counts '
                "the seeds on which the arm is better in the metric's direction).",
                "",
                *markdown_table(EVAL_HEADERS, eval_rows(prune, budget)),
            ]
        for sweep, found in budget.get("sweeps", {}).items():
            loss = found["calibration_loss"][found["best"]]
            lines += [
                f"The best setting of the {sweep!r} grid by the mean loss on its calibration "
                f"windows (training text; the eval windows chose nothing): {found['best']!r} "
                f"({loss:.4f}).",
                "",
            ]
        for name, arm in budget["arms"].items():
            if "search" in arm:  # an evolve arm: how far its search went, and why it stopped
                from geospec.prune.unit_search import stop_reason

                paths = "; ".join(
                    f"seed {seed}: {found['fitness'][0]:.4g} to {found['fitness'][-1]:.4g}, "
                    f"{sum(found['accepted'])} of {len(found['accepted'])} generations moved"
                    + stop_reason(found.get("stopped"), ", ")
                    for seed, found in arm["search"].items()
                )
                lines += [
                    f"The search {name!r}: its fitness on the calibration windows (training "
                    f"text; the eval windows chose nothing), first generation to last: {paths}.",
                    "",
                ]
        pairs = [(a, b) for a, b in compare if a in budget["arms"] and b in budget["arms"]]
        if pairs:
            lines += [
                "Further comparisons (report.compare), Holm-adjusted across these rows:",
                "",
                *markdown_table(HEADERS, budget_rows(prune, budget, pairs)),
            ]
    for image in images:
        lines += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(lines)
