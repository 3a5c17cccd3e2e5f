"""What ``geospec export`` writes from a prune unit (``RUN/prune/keep-F/ARM/seed-K``) and, as a
GGUF file, from a trained arm: the formats' writers (:mod:`geospec.prune.true_width`,
:mod:`geospec.prune.gguf_export`) applied to a finished run's own files, its tokenizer found
where the run recorded it."""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.errors import UsageError

if TYPE_CHECKING:
    from geospec.spec.sections import PruneSpec, ReferenceSpec

#: A prune unit's record and its exported model (as the prune stage writes them).
UNIT_FILE = "result.json"
UNIT_MODEL = "model"


def is_prune_unit(directory: Path) -> bool:
    """``RUN/prune/keep-F/ARM/seed-K``: a prune unit's directory (its record may be missing)."""
    parts = directory.resolve().parts
    return (
        len(parts) >= 4
        and parts[-4] == "prune"
        and parts[-3].startswith("keep-")
        and parts[-1].startswith("seed-")
    )


def unit_model(unit: Path) -> Path:
    """The unit's exported model directory, or one line saying why there is none."""
    from geospec.rundir.artifacts import json_problem

    if not unit.is_dir():  # a keep, arm or seed the prune does not have: not "unfinished"
        prune = unit.parents[2]
        found = sorted(
            f"{p.parents[1].name.removeprefix('keep-')}/{p.parent.name}/{p.name}"
            for p in prune.glob("keep-*/*/seed-*")
            if p.is_dir()
        )
        known = f"its units (keep/arm/seed): {', '.join(found)}" if found else "it has no unit"
        raise UsageError(f"{unit}: no such prune unit in {prune}; {known}")
    if (problem := json_problem(unit / UNIT_FILE, "widths", "loss")) is not None:
        raise UsageError(
            f"{unit}: the prune unit has not finished ({problem}); run geospec prune again"
        )
    model = unit / UNIT_MODEL
    if not (model / "config.json").is_file():
        raise UsageError(
            f"{unit}: no exported model ({UNIT_MODEL}/); set [prune] export = true in the spec "
            "and run geospec prune again (finished units are exported, not recomputed)"
        )
    return model


def run_checkpoint(unit: Path) -> Path | None:
    """The unit's local reference checkpoint: its ``.gguf`` file or directory (read from the
    run's spec.resolved.toml, relative paths from the spec file's directory); None when the run
    does not say or names a hub checkpoint."""
    import tomllib

    from geospec.hub import spec_path

    run_dir = unit.resolve().parents[3]
    try:
        resolved = tomllib.loads((run_dir / "spec.resolved.toml").read_text())
        spec_file = Path(json.loads((run_dir / "run.json").read_text())["spec"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    reference = resolved.get("reference") or {}
    checkpoint = reference.get("checkpoint")
    if not isinstance(checkpoint, str) or reference.get("revision"):
        return None  # a hub checkpoint: its files are in the Hugging Face cache, not here
    return spec_path(checkpoint, spec_file.parent)


def run_tokenizer_source(unit: Path) -> Path | None:
    """Where the unit's reference checkpoint keeps its tokenizer: the ``.gguf`` file, or the
    checkpoint directory when it holds tokenizer.json; None when the run does not say."""
    path = run_checkpoint(unit)
    if path is None:
        return None
    if path.is_file() and path.suffix == ".gguf":
        return path
    if (path / "tokenizer.json").is_file():
        return path
    return None


def save_run_tokenizer(unit: Path, directory: Path) -> bool:
    """Save the unit's reference checkpoint's tokenizer (chat template included: a GGUF's comes
    with it) into ``directory``, so that ``AutoTokenizer`` reads the export as it is; False when
    the run does not say where it is (:func:`run_tokenizer_source`)."""
    source = run_tokenizer_source(unit)
    if source is None:
        return False
    _tokenizer(source).save_pretrained(directory)
    return True


@functools.lru_cache(maxsize=2)
def _tokenizer(source: Path) -> Any:
    """The tokenizer at ``source`` (a .gguf file or a directory), read once per process: a prune
    saves it into every unit's export."""
    from transformers import AutoTokenizer

    if source.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    return AutoTokenizer.from_pretrained(source)


def export_prune_unit(
    unit: Path,
    to: Path,
    fmt: str,
    dtype: str | None = None,
    tokenizer: Path | None = None,
    padded: bool = False,
    model: Path | None = None,
) -> str:
    """Write a prune unit's model to ``to``: ``hf``, the unit's checkpoint as the prune stored it
    (a directory, copied atomically, with the run's tokenizer), or with ``padded`` every FFN
    zero-padded to the widest layer (:func:`export_padded`); ``gguf``, a GGUF file at its true
    widths, in ``dtype`` (None: the reference GGUF file's own type, f16 for any other
    reference: :func:`geospec.prune.gguf_quant.default_dtype`). The one line the command
    prints, with the file's size against the reference checkpoint's. ``model``: another model
    directory of the unit's to write (its healed one: ``geospec heal``; None: its ``model/``)."""
    if fmt == "hf":
        return export_padded(unit, to, model) if padded else export_with_tokenizer(unit, to, model)
    if padded:
        raise UsageError("--padded: a GGUF file stores the true widths; leave --padded out")
    model = model or unit_model(unit)
    checkpoint = run_checkpoint(unit)
    reference = run_tokenizer_source(unit)
    # a GGUF reference's tokenizer fields are copied as they are: exactly what llama.cpp read
    # from the source (the unit's tokenizer.json is transformers' rebuild of them)
    own = reference if reference is not None and reference.suffix == ".gguf" else None
    source = tokenizer or own or (model if (model / "tokenizer.json").is_file() else None)
    source = source or reference
    if source is None:
        raise UsageError(
            f"{unit}: the run's reference checkpoint holds no tokenizer this command can find; "
            "give --tokenizer (the checkpoint's .gguf file, or a directory with tokenizer.json)"
        )
    written, why = unit_gguf(model, _gguf_target(to), checkpoint, source, dtype)
    return _gguf_line(written, why, checkpoint)


def unit_gguf(
    model: Path, to: Path, checkpoint: Path | None, tokenizer: Path, dtype: str | None = None
) -> tuple[Any, str]:
    """A unit's exported model directory written as the GGUF file ``to`` with ``tokenizer``'s
    fields, in ``dtype`` (None: the type :func:`geospec.prune.gguf_quant.default_dtype` gives for
    the reference ``checkpoint``): the one path of ``geospec export --format gguf`` and of what
    the report's "What to ship" measures before anything is exported. The writer's
    :class:`~geospec.prune.gguf_export.Written` and why it chose the type, in words."""
    from geospec.prune.gguf_export import write_gguf
    from geospec.prune.gguf_quant import check_dtype, default_dtype

    if dtype is None:
        dtype, why = default_dtype(checkpoint)
    else:
        dtype, why = check_dtype(dtype), "as asked"
    return write_gguf(model, to, dtype, tokenizer=tokenizer), why


def export_padded(unit: Path, to: Path, model_dir: Path | None = None) -> str:
    """A prune unit's model as a checkpoint that plain ``AutoModelForCausalLM.from_pretrained``
    (and every tool that needs one ``intermediate_size``) reads: each layer's FFN zero-padded to
    the widest (its padded units compute exactly zero, so the logits are the true-width
    model's), in the unit's dtype, with the true widths in config.json's geospec block and the
    unit's tokenizer beside it. The one line the command prints, with what the padding costs."""
    import torch

    from geospec.engine.pretrained import hidden_width
    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of
    from geospec.prune.hf_export import export_pruned
    from geospec.prune.true_width import load_pruned, read_widths
    from geospec.prune.units import EXPORTED_FILE
    from geospec.storage.atomic import atomic_directory, check_new_directory

    source = model_dir or unit_model(unit)
    check_new_directory(to, f"--to {to}")
    widths = read_widths(source)
    model = load_pruned(source)
    first = torch.zeros((1, 2), dtype=torch.long)
    sites = find_ffn_sites(model, hidden_width(model), lambda: logits_of(model, first))
    weights = {"model.safetensors", "model.safetensors.index.json", "config.json", EXPORTED_FILE}
    with atomic_directory(to) as work:
        stored = export_pruned(model, sites, widths, work, padded=True)
        for file in source.iterdir():  # the tokenizer, chat template, generation config
            if file.is_file() and file.name not in weights and not (work / file.name).exists():
                shutil.copy2(file, work / file.name)
        found = (work / "tokenizer_config.json").is_file() or save_run_tokenizer(unit, work)
    cost = stored.padded_parameters - stored.true_parameters
    return (
        f"exported {_unit_name(unit)} padded to {stored.padded_to or max(widths)} "
        f"(true widths {' '.join(map(str, widths))}; the padding stores {cost:,} zero "
        f"parameters, +{cost / stored.true_parameters:.1%}), "
        f"{'with its tokenizer' if found else 'without a tokenizer'} -> {to}"
    )


def export_with_tokenizer(unit: Path, to: Path, model_dir: Path | None = None) -> str:
    """A prune unit's exported model as a new directory ``to`` with the run's tokenizer saved
    beside it (``AutoTokenizer`` reads it; a GGUF source's chat template comes with it), as
    ``geospec prune --export`` writes it. The one line the command prints."""
    from geospec.prune.true_width import read_widths
    from geospec.prune.units import EXPORTED_FILE
    from geospec.storage.atomic import atomic_directory, check_new_directory

    model = model_dir or unit_model(unit)
    check_new_directory(to, f"--to {to}")
    with atomic_directory(to) as work:
        shutil.copytree(
            model, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns(EXPORTED_FILE)
        )
        # a unit's model/ holds the tokenizer already (save_run_tokenizer); older ones do not
        found = (work / "tokenizer_config.json").is_file() or save_run_tokenizer(unit, work)
    widths = " ".join(map(str, read_widths(model)))
    with_tokenizer = "with its tokenizer" if found else "without a tokenizer"
    return f"exported {_unit_name(unit)} at widths {widths}, {with_tokenizer} -> {to}"


def _unit_name(unit: Path) -> str:
    """A unit as the export lines name it: its arm and seed ("flap seed 0")."""
    return f"{unit.parent.name} seed {unit.name.removeprefix('seed-')}"


def export_training_gguf(
    training_dir: Path, to: Path, dtype: str | None = None, tokenizer_dir: Path | None = None
) -> str:
    """A finished trained arm (a Llama-family geospec model) as a GGUF file at its true widths,
    with the run's tokenizer, in ``dtype`` (None: f16; a trained model has no source file). The
    one line the command prints."""
    from geospec.engine.export import LLAMA, save_tokenizer, training_model
    from geospec.prune.gguf_export import write_gguf
    from geospec.prune.true_width import set_widths

    target = _gguf_target(to)
    exported, tokenizer, eot = training_model(training_dir, tokenizer_dir)
    if exported.family != LLAMA:
        raise UsageError(
            f"{training_dir}: a {exported.family} model; the GGUF writer maps Llama-family "
            "models (rope, rmsnorm, swiglu) to llama.cpp's deci architecture; export this one "
            "with --format hf"
        )
    model: Any = exported.model
    set_widths(model, exported.widths)  # the padding sits after each layer's live units
    with tempfile.TemporaryDirectory() as scratch:
        save_tokenizer(tokenizer, eot, Path(scratch))
        written = write_gguf(model, target, dtype or "f16", tokenizer=Path(scratch))
    return _gguf_line(written, "as asked" if dtype else "the default for a trained model")


def _gguf_target(to: Path) -> Path:
    if to.suffix != ".gguf":
        raise UsageError(f"--to {to}: a GGUF file's name ends in .gguf (e.g. --to {to}.gguf)")
    if to.exists():
        raise UsageError(f"--to {to}: already exists; give a new file")
    return to


def _gguf_line(written: Any, why: str, source: Path | None = None) -> str:
    """What a GGUF export prints: its type and why, who quantized it, the matrices that fell
    back, its widths, and its size against ``source``'s (and an f16 file's)."""
    from geospec.prune.gguf_quant import (
        block_size,
        fallback_words,
        fallbacks,
        source_stored_types,
    )
    from geospec.prune.gguf_size import gguf_size

    kind = written.dtype if written.dtype in ("f32", "f16") else written.dtype.upper()
    fell = fallbacks(written.path, written.dtype)
    fallen = ""
    if fell:
        stored = ", ".join(f"{count} in {name}" for name, count in sorted(fell.items()))
        in_source = source_stored_types(source, written.dtype)
        fallen = (
            f"; {sum(fell.values())} matrices whose rows do not split into blocks of "
            f"{block_size(written.dtype)} are stored as llama.cpp's quantizer falls back: {stored}"
            + fallback_words(fell, in_source.fallbacks if in_source else None)
        )
    return (
        f"exported GGUF {kind} ({why}; written by {written.quantizer}), llama.cpp architecture "
        f"deci, FFN widths {' '.join(map(str, written.widths))}: {written.parameters:,} "
        f"parameters, {gguf_size(written.path, source).line()}{fallen} -> {written.path}"
    )


def export_dtype(prune: PruneSpec, reference: ReferenceSpec, spec_dir: Path) -> str:
    """The dtype a prune's models are written in: ``prune.export_dtype``, where "checkpoint" is
    the dtype the checkpoint's config.json declares (a GGUF file, which declares none, or
    another: ``reference.dtype``, the dtype the model is computed in)."""
    from geospec.engine.pretrained import DTYPES
    from geospec.spec.checkpoint_shape import read_checkpoint_facts

    if prune.export_dtype != "checkpoint":
        return prune.export_dtype
    checkpoint = reference.checkpoint
    facts = (
        read_checkpoint_facts(checkpoint, reference.revision, spec_dir)
        if checkpoint is not None
        else None
    )
    declared = None if facts is None else facts.dtype
    return declared if declared in DTYPES else reference.dtype
