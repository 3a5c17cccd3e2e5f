"""The short resolved summary ``geospec validate`` prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from geospec.data.bundled import BUNDLED, BUNDLED_PREFIX, MIX, mix_description
from geospec.shapes.model_size import count_params, total_ffn_params
from geospec.spec.resolve import (
    declared_vocab_size,
    measures,
    model_shape,
    probes,
    prunes_only,
)
from geospec.spec.sections import DataSpec, PretrainedTokenizer, PruneSpec, Spec

if TYPE_CHECKING:
    from geospec.shapes.memory import HealingEstimate
    from geospec.shapes.repair import RepairEstimate


def spec_summary(spec: Spec) -> Group:
    m = spec.model
    vocab = declared_vocab_size(spec)
    widths = [m.ffn_width] * m.n_layers
    total = f"{count_params(model_shape(spec, vocab), widths):,}" if vocab else "(from tokenizer)"
    ffn = total_ffn_params(m.d_model, widths, m.activation, m.bias)
    head = Table.grid(padding=(0, 2))
    head.add_row("spec", spec.name)
    head.add_row("run directory", spec.run_dir)
    head.add_row(
        "model",
        f"{m.n_layers} layers, d_model {m.d_model}, {m.n_heads} heads"
        + (f" ({m.n_kv_heads} key/value)" if m.n_kv_heads is not None else "")
        + f", seq_len {m.seq_len}, "
        f"{m.activation}, {m.norm}, {m.positions} positions",
    )
    head.add_row("parameters", f"{total} (vocab {vocab or '?'}; equal for every arm)")
    head.add_row(
        "FFN budget",
        f"{m.n_layers} x {m.ffn_width} = {m.n_layers * m.ffn_width} hidden units, "
        f"{ffn:,} FFN parameters, widths in multiples of {m.multiple_of}",
    )
    reference = (
        f"checkpoint {spec.reference.checkpoint}"
        + (f" at commit {spec.reference.revision}" if spec.reference.revision else "")
        + (f", {spec.reference.dtype}" if spec.reference.dtype != "float32" else "")
        if spec.reference.checkpoint
        else f"train uniform model for {spec.reference.train_steps} steps"
        if spec.reference.train_steps
        else "train uniform model with the train settings (seed "
        f"{spec.reference.seed}: the uniform arm's run for that seed is reused)"
    )
    head.add_row("reference", reference)
    head.add_row("data", Text(data_row(spec.data)))
    budget = f"{spec.train.steps} steps" if spec.train.steps else f"{spec.train.tokens:,} tokens"
    if not spec.probe_only:
        t = spec.train
        micro = f" (micro-batch {t.micro_batch_size})" if t.micro_batch_size else ""
        head.add_row(
            "training",
            f"{budget}, batch {t.batch_size}{micro}, seeds {list(t.seeds)}, lr {t.lr:g} "
            f"(cosine to {t.min_lr_ratio:g} x), precision {t.precision}, device {t.device}",
        )
        launch = spec.launch.model_dump(mode="json") if spec.launch else {"kind": "local"}
        head.add_row("launch", Text(plugin_call(launch)))
        if spec.train.trackers:
            watched = [plugin_call(t.model_dump(mode="json")) for t in spec.train.trackers]
            head.add_row("trackers", Text(", ".join(watched)))
    profiles = [entry.profile for entry in measures(spec)]
    measured = ", ".join(profiles) if profiles else "(none)"
    if spec.measure is None and prunes_only(spec):  # "all" is what the [prune] arms read
        measured = (
            f'{measured} (what the [prune] arms read: measure = "all" in a spec that only prunes)'
            if profiles
            else 'none (the [prune] arms read no measured profile; measure = "all" in a spec '
            "that only prunes is what they read)"
        )
    head.add_row("measures", Text(measured))
    if not probes(spec):
        head.add_row(
            "probe",
            Text("skipped: nothing reads the clouds (no profile is measured; [diagnose] is off)"),
        )
    if spec.probe.replicates > 1:
        head.add_row(
            "replicates",
            f"every profile on {spec.probe.replicates} disjoint samples of {spec.probe.tokens} "
            f"tokens (the solver uses their mean; flagged below split-half "
            f"{spec.report.min_reliability:g})",
        )
    if spec.probe.calibration_split == "train" and probes(spec):  # said only where they run
        head.add_row(
            "calibration",
            "probe, diagnose and demand read the training split (probe.calibration_split): "
            "no eval window sets a width",
        )
    if (computed := compute_row(spec)) is not None:
        head.add_row("compute dtype", computed)
    if spec.report.compare:
        head.add_row("compare", ", ".join(f"{a} vs {b}" for a, b in spec.report.compare))
    if spec.diagnose.enabled:
        settings = spec.diagnose.model_dump(mode="json", exclude={"enabled", "compute_dtype"})
        head.add_row("diagnose", ", ".join(f"{k}={v}" for k, v in settings.items()))
    if spec.demand.enabled:
        d = spec.demand
        head.add_row(
            "demand",
            Text(
                f"keep {', '.join(f'{f:g}' for f in d.keep)} by "
                f"{plugin_call(d.importance.model_dump(mode='json'))}; {d.windows} windows, "
                f"{d.pairs} pairs at {d.pair_keep:g}"
            ),
        )
    if spec.prune is not None:
        p = spec.prune
        head.add_row(
            "prune",
            Text(
                f"keep {', '.join(f'{f:g}' for f in p.fractions)} by "
                f"{plugin_call(p.importance.model_dump(mode='json'))}"
                f"{repair_clause(p)}"
                "; calibration seeds "
                f"{p.calibration.seeds} x {p.calibration.windows} windows"
                f"{' (each also re-draws the profiles)' if p.allocation_seeds else ''}; eval "
                f"{', '.join(p.eval.corpora)} x {p.eval.windows} windows; baseline {p.baseline}"
            ),
        )
    if spec.eval is not None:
        limit = f", limit {spec.eval.limit}" if spec.eval.limit is not None else ""
        head.add_row("eval", f"lm-eval: {', '.join(spec.eval.tasks)}{limit}")
    if spec.probe_only and not spec.arms:
        head.add_row("probe only", "no arm is trained; the checkpoint is pruned (geospec prune)")
    elif spec.probe_only:
        head.add_row("probe only", "no arm is trained; widths are computed and reported")
    arms = Table(title="arms", title_justify="left")
    arms.add_column("arm")
    arms.add_column("schedule")
    for arm in spec.arms:
        arms.add_row(arm.name, Text(plugin_call(arm.schedule.model_dump(mode="json"))))
    shown = [arms] if spec.arms else []
    if spec.prune is None:
        return Group(head, *shown)
    pruning = Table(title="prune arms", title_justify="left")
    pruning.add_column("arm")
    pruning.add_column("schedule")
    for arm in spec.prune.arms:
        pruning.add_row(arm.name, Text(plugin_call(arm.schedule.model_dump(mode="json"))))
    return Group(head, *shown, pruning)


def data_row(data: DataSpec) -> str:
    """Where the text comes from (what a default reads, by name) and how much is held out."""
    held_out = f"; {data.val_fraction * 100:g}% held out (split_seed {data.split_seed})"
    if data.files is not None:
        return f"files {', '.join(data.files)}{held_out}"
    corpus = data.corpus or ""
    name = corpus.removeprefix(BUNDLED_PREFIX)
    if name == MIX:
        default = " (the default)" if data.source is None else ""
        return f"{corpus}{default}: {mix_description()}{held_out}"
    if corpus.startswith(BUNDLED_PREFIX) and name in BUNDLED:
        return f"{corpus}: {BUNDLED[name].about}{held_out}"
    config = f", config {data.hub_config}" if data.hub_config else ""
    return f"hub dataset {corpus}{config}, split {data.hub_split}{held_out}"


def repair_clause(prune: PruneSpec) -> str:
    """What the arms' kept neurons become, for validate's prune row ('' when every arm is only
    cut)."""
    said = {
        "mean": "bias compensated by the calibration means",
        "lstsq": "output projections re-fitted by least squares",
    }
    repairs = sorted({prune.repair_of(arm) for arm in prune.arms} - {"none"})
    if not repairs:
        return ""
    everyone = all(prune.repair_of(arm) != "none" for arm in prune.arms)
    return "; " + " or ".join(said[r] for r in repairs) + ("" if everyone else " (some arms)")


def uncached_hub_notes(spec: Spec) -> list[str]:
    """A note for each hub model the spec reads (``reference.checkpoint``, a pretrained
    ``data.tokenizer.path``; once for both when they name the same commit) at a commit the
    Hugging Face cache does not hold. Where ``[model]`` was filled from the checkpoint, its
    config.json is cached by now (or validation failed), so the note is for a spec that gives
    ``[model]`` in full."""
    from geospec.hub import Source, uncached_note

    sources = []
    if spec.reference.checkpoint is not None and spec.reference.revision is not None:
        sources.append(
            Source(spec.reference.checkpoint, "reference.checkpoint", spec.reference.revision)
        )
    tokenizer = spec.data.tokenizer
    if isinstance(tokenizer, PretrainedTokenizer) and tokenizer.revision is not None:
        sources.append(Source(tokenizer.path, "data.tokenizer.path", tokenizer.revision))
    notes: list[str] = []
    seen: set[tuple[str, str | None]] = set()
    for source in sources:
        if (source.location, source.revision) not in seen:
            seen.add((source.location, source.revision))
            if (note := uncached_note(source)) is not None:
                notes.append(note)
    return notes


def plugin_call(params: dict[str, Any]) -> str:
    """A plugin table as ``kind(key=value, ...)``, nested tables alike, unset options left out."""
    params = dict(params)
    kind = params.pop("kind")
    parts = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, dict) and "kind" in value:
            value = plugin_call(value)
        parts.append(f"{key}={value}")
    return f"{kind}({', '.join(parts)})" if parts else str(kind)


def compute_row(spec: Spec) -> str | None:
    """What the forward passes on the reference compute in, per stage that runs them (None when
    none does), as this machine's CPU resolves "auto" (a GPU decides for itself at run time)."""
    from geospec.hardware import cpu_computes_bf16
    from geospec.spec.resolve import probes

    stages: dict[str, str] = {"probe": spec.probe.compute_dtype} if probes(spec) else {}
    if spec.diagnose.enabled:
        stages["diagnose"] = spec.diagnose.compute_dtype
    if spec.demand.enabled:
        stages["demand"] = spec.demand.compute_dtype
    if spec.prune is not None:
        stages["prune"] = spec.prune.compute_dtype
    if not stages:
        return None
    weights = spec.reference.dtype if spec.reference.checkpoint is not None else "float32"
    if weights != "float32":
        return f"{weights}, the weights' own (reference.dtype)"
    native = "bfloat16" if cpu_computes_bf16() else "float32"
    said = []
    for name, requested in stages.items():
        said.append(
            f"{name} {native} (auto on this CPU)" if requested == "auto" else f"{name} {requested}"
        )
    note = "; autocast over float32 weights" if any("float16" in s for s in said) else ""
    return ", ".join(said) + note


def memory_lines(spec: Spec, widths: Mapping[str, Sequence[int]]) -> list[str]:
    """Each arm's estimated training memory per process (``geospec validate``), at the arm's
    widths where they are computable without profiles and at the uniform widths otherwise (the
    same FFN budget: only the widest layer's backward differs); and, where the spec heals its
    pruned models, the prune's process while it heals one."""
    import os

    from geospec.shapes.memory import micro_batching, training_memory

    vocab = declared_vocab_size(spec)
    if vocab is None:
        return []
    train = spec.train
    cuda = train.device.startswith("cuda")
    shape = model_shape(spec, vocab)
    lines = []
    if not spec.probe_only:
        processes = int(os.environ.get("WORLD_SIZE", "1"))
        micro, _ = micro_batching(train, processes)
        bf16 = train.precision == "bf16" or (train.precision == "auto" and cuda)
        uniform = [spec.model.ffn_width] * spec.model.n_layers
        for arm in spec.arms:
            estimate = training_memory(
                shape, widths.get(arm.name, uniform), micro, bf16=bf16, processes=processes,
                sharded=processes > 1 and train.distributed == "fsdp2",
            )  # fmt: skip
            lines.append(f"memory of arm {arm.name}: {estimate.describe()}")
    arms = bool(lines)
    lines += [
        f"memory of the least-squares repair ({arms}): {estimate.describe()}"
        for arms, estimate in repair_estimates(spec).items()
    ]
    heals = spec.prune is not None and spec.prune.heal.steps > 0
    if spec.prune is not None and (heals or spec.prune.select is not None):
        # with select and no [prune.heal], what `geospec heal` costs the recommended model
        keep = max(spec.prune.fractions)
        described = healing_estimate(spec, vocab, distill=None if heals else True).describe()
        lines.append(f"memory of healing (keep {keep:g}): {described}")
        lines.append(healing_time_line(spec, vocab))
    # healing's precision is always auto; an arm's is train.precision
    if train.device == "auto" and (heals or (arms and train.precision == "auto")):
        note = (
            "memory: precision auto is counted as fp32 (its setting on CPU; on CUDA it is bf16 "
            "autocast, with smaller activations)"
        )
        if arms:  # healing runs in the prune's one process
            note += "; WORLD_SIZE=N geospec validate shows it per process of N processes"
        lines.append(note)
    return lines


def repair_estimates(spec: Spec) -> dict[str, RepairEstimate]:
    """The least-squares repair's estimate for each distinct way the prune's arms repair (their
    inputs and calibration windows, and for a search its levels' spacing; the damping costs
    nothing), by the arms that repair so, at the largest keep fraction (the largest system to
    solve). A search (``evolve``) over re-fitted levels also holds every layer's moments from
    one pass and its levels' re-fits."""
    from geospec.kinds import ScoreAllocation
    from geospec.plugin import create_plugin
    from geospec.shapes.pruned import pruned_width
    from geospec.shapes.repair import repair_estimate

    prune, m = spec.prune, spec.model
    if prune is None:
        return {}
    ways: dict[tuple[str, int, int | None], list[str]] = {}
    for arm in prune.arms:
        if prune.refits(arm):
            lstsq = prune.lstsq_of(arm)
            schedule = create_plugin("schedule", arm.schedule)
            searching = isinstance(schedule, ScoreAllocation) and schedule.reads_search
            spacing = int(getattr(schedule.params, "step", 1)) * m.multiple_of
            way = (lstsq.inputs, lstsq.windows or prune.calibration.windows)
            ways.setdefault((*way, spacing if searching else None), []).append(arm.name)
    kept = min(pruned_width(max(prune.fractions), m.ffn_width, m.multiple_of), m.ffn_width)
    batch = prune.calibration.batch_size
    return {
        ", ".join(arms): repair_estimate(
            m.n_layers, m.ffn_width, m.d_model, kept, windows, m.seq_len, batch, inputs, spacing
        )
        for (inputs, windows, spacing), arms in sorted(
            ways.items(), key=lambda way: (*way[0][:2], way[0][2] or 0)
        )
    }


def healing_time_line(spec: Spec, vocab: int) -> str:
    """How long healing takes (:mod:`geospec.shapes.heal_time`), at the largest keep fraction:
    with ``[prune.heal]``, every pruned model's in the prune; without, the recommended model's
    by ``geospec heal`` at its default steps, distilled."""
    from geospec.shapes.heal_time import DEFAULT_STEPS, duration, healing_time
    from geospec.shapes.model_size import count_params
    from geospec.shapes.pruned import pruned_dims

    assert spec.prune is not None
    prune, m = spec.prune, spec.model
    shape = model_shape(spec, vocab)
    keep = max(prune.fractions)
    dims = pruned_dims(m.n_layers, m.d_model, m.ffn_width, m.multiple_of, keep, m.activation)
    unpruned = count_params(shape, [m.ffn_width] * m.n_layers)
    pruned = count_params(shape, [dims.ffn_width] * m.n_layers)
    heal = prune.heal
    if heal.steps > 0:
        models = len(prune.arms) * len(prune.fractions) * len(prune.calibration.seeds)
        took = healing_time(
            pruned, unpruned, heal.steps, heal.batch_size, m.seq_len, distill=heal.distill > 0
        )
        return (
            f"time of healing (keep {keep:g}): {took.describe()} per model; at most "
            f"{duration(models * took.seconds)} for the {models} pruned models"
        )
    took = healing_time(pruned, unpruned, DEFAULT_STEPS, heal.batch_size, m.seq_len, distill=True)
    return (
        f"time of healing the recommended model (keep {keep:g}) with geospec heal SPEC "
        f"best@{keep:g}: {took.describe()}"
    )


def healing_estimate(spec: Spec, vocab: int, distill: bool | None = None) -> HealingEstimate:
    """The prune's process while it heals its largest pruned model (at the largest keep
    fraction; every arm of a budget has its parameters), healing's precision resolved as
    training's (auto: bf16 autocast on CUDA); ``distill``: whether it distils (None: as
    ``heal.distill`` says)."""
    from geospec.shapes.memory import DTYPE_BYTES, healing_memory
    from geospec.shapes.pruned import pruned_dims

    assert spec.prune is not None
    m, heal = spec.model, spec.prune.heal
    shape = model_shape(spec, vocab)
    keep = max(spec.prune.fractions)
    dims = pruned_dims(m.n_layers, m.d_model, m.ffn_width, m.multiple_of, keep, m.activation)
    return healing_memory(
        shape, [m.ffn_width] * m.n_layers, [dims.ffn_width] * m.n_layers, heal.batch_size,
        checkpoint_bytes=DTYPE_BYTES[spec.reference.dtype],
        distill=heal.distill > 0 if distill is None else distill,
        bf16=spec.train.device.startswith("cuda"),
    )  # fmt: skip
