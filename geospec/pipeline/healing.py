"""How a pruned model is healed: by the prune stage (``[prune.heal]``: every unit, into its
``heal/``) or by ``geospec heal`` (one exported unit, into its ``healed/``: :func:`heal_exported`).
Imported, trained through :func:`geospec.pipeline.training.train_into` like every training run
(claimed, resumable, a failure recorded), optionally distilled from the unpruned reference, and
scored again on the eval corpora (:func:`geospec.prune.heal.healed_losses` does the import and
scoring; this module hands it the trainer)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.errors import GeospecError
from geospec.rundir.artifacts import read_json
from geospec.spec.sections import PruneHeal

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from torch import nn

    from geospec.engine.distill import Teacher
    from geospec.engine.model import GPT, GPTConfig
    from geospec.pipeline.context import RunContext
    from geospec.prune.heal import Healer
    from geospec.prune.units import Unit
    from geospec.spec.sections import DataSpec, Spec, TrainSpec


def healer(
    run: RunContext,
    heal: PruneHeal,
    seq_len: int,
    data: DataSpec,
    threads: int | None,
    corpora: dict[str, list[Any]],
    reference: nn.Module,
) -> Healer:
    """How a unit's pruned model is healed: trained into its ``heal/`` like any run (with
    ``heal.distill``, distilling from ``reference``, the unpruned model)."""
    from geospec.pipeline.training import TrainingJob, train_into
    from geospec.prune.heal import heal_settings, healed_losses, teacher_of

    teachers: list[Teacher] = []  # imported once, at the first healing that needs it

    def teacher() -> Teacher | None:
        if heal.distill == 0:
            return None
        if not teachers:
            teachers.append(teacher_of(reference, seq_len, heal))
        return teachers[0]

    def train(
        config: GPTConfig,
        initial: dict[str, torch.Tensor],
        settings: TrainSpec,
        out: Path,
        key: str,
        seed: int,
        *,
        announce: str,
    ) -> bool:
        tokens = run.token_data(data)
        job = TrainingJob(
            out, key, list(config.ffn_widths), config, settings, tokens, seed,
            initial=initial, teacher=teacher(),
        )  # fmt: skip
        # the training bar (step, loss, tokens/s, eta; a line per log interval in logs): the
        # prune's bar of units is off the screen meanwhile (prune.study.shown_alone)
        trained = train_into(run, job, announce=announce, progress=True)
        return trained is not None

    def healed(unit: Unit, out: Path, key: str, imported: GPT) -> dict[str, float]:
        settings = heal_settings(heal, unit.seed, run.device, threads, seq_len)
        distilled = ""
        if heal.distill:
            distilled = f", distilled from the unpruned model (distill {heal.distill:g})"
        batch = f"{settings.batch_size} x {seq_len} tokens"
        announce = f"[bold]heal[/]: {unit.label}, {settings.steps} steps of {batch}{distilled}"
        trainer = functools.partial(train, announce=announce)
        losses = healed_losses(imported, settings, out, key, unit.seed, trainer, corpora, run.say)
        if losses is None:
            raise GeospecError(
                f"prune: {out} is being healed by another process; wait for it to finish "
                "and run again"
            )
        return losses

    return healed


@dataclass(frozen=True)
class Healed:
    """One exported model healed by ``geospec heal``: where the healed model is, its settings,
    its losses on the eval corpora before and after, whether it was healed now (False: a
    finished healing of the same inputs, reused), the fixed prompts' greedy continuations
    before and after (:func:`geospec.prune.continuations.healed_continuations`; None in a
    record written before they were kept) and the unhealed model's mean loss on the selection
    windows, as its unit recorded it (None: a prune without ``select``)."""

    model: Path
    settings: PruneHeal
    before: dict[str, float]
    after: dict[str, float]
    now: bool
    continuations: dict[str, list[str]] | None = None
    before_select: float | None = None


def heal_exported(
    spec: Spec, spec_path: Path, run_dir: Path, unit: Unit, steps: int, console: Console
) -> Healed:
    """Heal one finished, exported prune unit's model (``geospec heal``): imported into the
    engine, distilled from the unpruned model with :func:`shipped_settings` into the unit's
    ``healed/train/`` (claimed, resumable), scored again on the prune's eval corpora, and
    written into ``healed/model/`` as the unit's own model is (its family, dtype, tokenizer and
    compensation bias). A healing of the same unit key and settings is reused."""
    import torch

    from geospec.engine.checkpoint import load_model
    from geospec.engine.distributed import context
    from geospec.engine.imported import import_llama, load_into_llama
    from geospec.engine.pretrained import hidden_width
    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.pipeline.context import RunContext
    from geospec.pipeline.keys import section
    from geospec.pipeline.stages.reference import load_reference
    from geospec.prune.continuations import healed_continuations
    from geospec.prune.corpora import eval_batches
    from geospec.prune.exports import export_dtype
    from geospec.prune.true_width import load_pruned, read_widths
    from geospec.prune.unit_export import export_unit
    from geospec.prune.units import finished_unit, has_model
    from geospec.rundir.layout import HEALED_DIR, HEALED_TRAIN_DIR, UNIT_FILE, UNIT_MODEL_DIR
    from geospec.storage.atomic import atomic_write_json
    from geospec.storage.digests import digest, sealed

    assert spec.prune is not None
    prune, unit_dir = spec.prune, unit.directory(run_dir)
    stored = read_json(unit_dir / UNIT_FILE)
    settings = shipped_settings(prune.heal, steps)
    key = digest("heal-exported", stored["key"], section(settings))
    healed_dir = unit_dir / HEALED_DIR
    dtype = export_dtype(prune, spec.reference, spec_path.parent)
    before = {name: float(loss) for name, loss in stored["loss"].items()}
    windows = stored.get("select_loss")  # what the recommendation read (prune.select)
    before_select = sum(windows) / len(windows) if windows else None
    record = finished_unit(healed_dir, key)
    if record is not None and has_model(healed_dir, key, dtype):
        return Healed(
            healed_dir / UNIT_MODEL_DIR, settings, before, record["healed_loss"], False,
            record.get("continuations"), before_select,
        )  # fmt: skip
    run = RunContext(
        run_dir, spec_path.parent, console, context(), spec.train.device, spec_path=spec_path
    )
    reference, _ = load_reference(run, spec.reference)
    device = next(reference.parameters()).device
    seq_len = spec.model.seq_len
    corpora = eval_batches(prune.eval, spec.data, seq_len, run.token_data, device)
    heal = healer(run, settings, seq_len, spec.data, spec.train.threads, corpora, reference)
    # the transformers model is not held while healing (its memory: validate's estimate); it
    # is read again to carry the healed weights out in the checkpoint's family
    imported = import_llama(load_pruned(unit_dir / UNIT_MODEL_DIR, torch.float32), seq_len)
    with torch.autocast(device.type, enabled=False):  # healing trains in its own precision
        after = heal(unit, healed_dir / HEALED_TRAIN_DIR, key, imported)
    del imported
    run.say(f"heal: writing the healed {unit.label} into {healed_dir / UNIT_MODEL_DIR}")
    cut = load_pruned(unit_dir / UNIT_MODEL_DIR, torch.float32)
    load_into_llama(cut, load_model(healed_dir / HEALED_TRAIN_DIR, torch.device("cpu")))
    first = torch.zeros((1, 2), dtype=torch.long)
    sites = find_ffn_sites(cut, hidden_width(cut), lambda: logits_of(cut, first))
    widths = read_widths(unit_dir / UNIT_MODEL_DIR)
    export_unit(cut, sites, widths, healed_dir / UNIT_MODEL_DIR, key, dtype, unit_dir)
    run.say("heal: the fixed prompts' greedy continuations before and after")
    data = run.token_data(spec.data)
    unhealed = load_pruned(unit_dir / UNIT_MODEL_DIR, torch.float32)
    continued = healed_continuations(unhealed, cut, data.tokenizer(), data.bos_id, data.eot_id)
    result = {"key": key, "widths": widths, "loss": before, "healed_loss": after,
              "heal": settings.model_dump(mode="json"), "continuations": continued}  # fmt: skip
    atomic_write_json(healed_dir / UNIT_FILE, sealed(result))
    return Healed(
        healed_dir / UNIT_MODEL_DIR, settings, before, after, True, continued, before_select
    )


@dataclass(frozen=True)
class ShippedFile:
    """A healed model's GGUF file scored with its own (de-quantized) weights: its loss on each
    eval corpus (shown, not used) and, where ``[prune] select`` is set, on the selection windows
    beside the healed float32 model's (``{"float32": ..., "shipped": ...}``), which the advice
    on the file's type reads (no eval text in it)."""

    eval: dict[str, float]
    select: dict[str, float] | None


def shipped_file_scores(
    spec: Spec, spec_path: Path, run_dir: Path, model: Path, gguf: Path, console: Console
) -> ShippedFile:
    """The GGUF file ``gguf`` written from the healed ``model``, scored as ``geospec heal
    --format gguf`` ships it (healing moves every weight, the embeddings and attention
    included, off the source file's quantization grid, so the file's type can cost more after
    healing than before)."""
    from geospec.engine.distributed import context
    from geospec.engine.train import resolve_device
    from geospec.pipeline.context import RunContext
    from geospec.prune.corpora import eval_batches
    from geospec.prune.gguf_weights import shipped_corpus_losses
    from geospec.prune.select import select_batches

    prune = spec.prune
    assert prune is not None
    run = RunContext(run_dir, spec_path.parent, console, context(), spec.train.device)
    device = resolve_device(spec.train.device)
    seq_len = spec.model.seq_len
    corpora = eval_batches(prune.eval, spec.data, seq_len, run.token_data, device)
    selection = None
    if prune.select is not None:
        selection = select_batches(prune, spec.data, seq_len, run.token_data, device)
    return ShippedFile(*shipped_corpus_losses(model, gguf, corpora, selection))


def shipped_settings(heal: PruneHeal, steps: int) -> PruneHeal:
    """How ``geospec heal`` heals one model: ``[prune.heal]``'s settings with ``steps`` steps,
    distilled from the unpruned model alone (``distill = 1``, as Minitron heals) and warmed up
    for a tenth of the steps, unless ``[prune.heal]`` sets those itself."""
    chosen = heal.model_fields_set
    return heal.model_copy(
        update={
            "steps": steps,
            "distill": heal.distill if "distill" in chosen else 1.0,
            "warmup": heal.warmup if "warmup" in chosen else steps // 10,
        }
    )
