"""What a recommended model ships as, measured before anything is exported (docs/prune.md, "What
to ship"): per keep fraction, the arm ``prune.select`` recommends, as calibration seed
``seeds[0]`` cut it (the model ``geospec prune --export best@KEEP`` writes), measured three ways:

- the bytes of its true-width safetensors in the prune's export dtype: the files of the model
  directory the prune writes (its ``model/``, or the same export into a temporary directory);
- where the reference is a GGUF file, the bytes of the GGUF file ``--export best@KEEP --format
  gguf --to ARM-KEEP.gguf`` writes (the same export path, :func:`geospec.prune.exports.
  unit_gguf`, in the source's own type) against the source file's
  (:mod:`geospec.prune.gguf_size`); a K-quant source without llama-cpp-python gets no size and
  a reason (the export would be llama.cpp's fallback type, not the source's);
- that GGUF file scored as shipped: its de-quantized weights in the model
  (:func:`geospec.prune.gguf_weights.shipped_losses`) on the selection windows, beside the
  float32 model's loss there, and the difference in nats (the scorer is handed in by the prune,
  which holds the windows); what each of its matrices is stored as, and how many FFN matrices
  fell back to another type for rows that are not whole blocks
  (:func:`geospec.prune.gguf_quant.stored_types`);
- with llama-cpp-python, that file's llama.cpp prompt and generation speed against the source
  file's (:func:`geospec.prune.runtime.compare_speeds`: best and median of 5 round-robin rounds
  on 2 threads, the machine's load average read before), unless ``prune.select.runtime =
  false``.

The temporary files are written in the keep fraction's directory (the run's disk) and removed.
The record is sealed in ``prune/keep-<f>/shipped.json`` under a key of the recommended unit's key
and what changes the measurement (the export dtype, the GGUF type and who writes it, the gguf and
llama-cpp-python versions, whether it is timed), so a rerun reuses it, another recommendation
(another unit) measures again (:func:`stale_shipped`), and the stage checks it against
prune.json's copy before it calls itself up to date (:func:`untrusted_shipped`). A prune.json
from before the record existed is measured into on the next run. Torch-free: the model is
written by the callable the prune hands in.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.errors import UsageError
from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import SHIPPED_FILE, prune_keep_dir
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import digest, sealed, unsealed

if TYPE_CHECKING:
    from geospec.prune.units import Unit
    from geospec.spec.sections import PruneSpec, ReferenceSpec

#: What every shipped.json holds (prune.json's ``budgets[i].recommended.shipped`` is the same
#: without its seal).
SHIPPED_FIELDS = ("key", "arm", "seed", "safetensors_bytes", "gguf", "speed")
#: What scores a GGUF file as shipped: (the float32 model's directory, the GGUF file) -> the
#: losses on the selection windows (:func:`geospec.prune.gguf_weights.shipped_losses`).
Scorer = Callable[[Path, Path], Mapping[str, float]]
#: The runtime benchmark's settings (benchmarks/pruned_runtime.py): threads, prompt tokens in
#: one batch, tokens generated one at a time, timed rounds (best and median).
THREADS, PROMPT, GENERATE, ROUNDS = 2, 128, 32, 5
#: Bumped when what a record measures changes, so older records are measured again (2: the
#: GGUF file scored, its matrices' types, speeds as best and median with the load).
RECORD = 2
#: Why a model without a GGUF file has no llama.cpp speed, and no score as shipped.
NO_GGUF = "no GGUF file to time"
NO_GGUF_SCORE = "no GGUF file to score"


def gguf_file_name(arm: str, keep: float) -> str:
    """The file the report's export command names (``--to owl-0.5.gguf``): the file whose size
    the record holds to the byte (its stem is the file's ``general.name``)."""
    return f"{arm}-{keep:g}.gguf"


def local_checkpoint(reference: ReferenceSpec, spec_dir: Path) -> Path | None:
    """The reference checkpoint on this machine (a ``.gguf`` file or a directory, relative paths
    from the spec's directory); None for a hub checkpoint or a trained reference."""
    from geospec.hub import spec_path

    if reference.checkpoint is None or reference.revision is not None:
        return None
    return spec_path(reference.checkpoint, spec_dir)


@dataclass(frozen=True)
class Plan:
    """What a measurement will do here: the GGUF type and who writes it (or why no GGUF file),
    and whether it is timed (or why not)."""

    dtype: str | None
    quantizer: str | None
    no_gguf: str | None
    timed: bool
    no_speed: str | None


@dataclass(frozen=True)
class ShipSettings:
    """How the recommended models are measured: the prune's export dtype (``prune.export_dtype``
    resolved), the reference checkpoint on this machine, and ``prune.select.runtime``."""

    export_dtype: str
    source: Path | None
    runtime: bool = True

    @property
    def gguf_source(self) -> Path | None:
        """The source GGUF file the GGUF export is compared with, or None."""
        source = self.source
        return source if source is not None and source.suffix == ".gguf" else None

    def plan(self) -> Plan:
        """What is measured on this machine, and why a piece is not."""
        from geospec.prune.gguf_quant import (
            INSTALL,
            K_QUANTS,
            default_dtype,
            quantizer,
            source_type,
        )
        from geospec.prune.runtime import have_llamacpp

        source = self.gguf_source
        dtype = written_by = no_gguf = None
        if source is None:
            no_gguf = "the reference is not a GGUF file: no source file to compare one with"
        elif not source.is_file():
            no_gguf = f"the source GGUF file {source} is not there"
        else:
            found = source_type(source)
            if found.dtype in K_QUANTS and not have_llamacpp():
                no_gguf = (
                    f"the source's {found.label} is written by llama.cpp's quantizer only "
                    f"({INSTALL})"
                )
            else:
                dtype = default_dtype(source)[0]
                written_by = quantizer(dtype)
        no_speed = None
        if not self.runtime:
            no_speed = "prune.select.runtime = false"
        elif dtype is None:
            no_speed = NO_GGUF
        elif not have_llamacpp():
            no_speed = "llama-cpp-python is not installed"
        return Plan(dtype, written_by, no_gguf, no_speed is None, no_speed)

    def key(self, unit_key: str, plan: Plan | None = None) -> str:
        """The record's key for the recommended unit of key ``unit_key``: what it measures and
        with what (the versions of the writers and of llama.cpp), not the reasons' words."""
        from geospec.prune.gguf_quant import LLAMA_CPP

        plan = plan or self.plan()
        gguf = None if plan.dtype is None else [plan.dtype, plan.quantizer, _version("gguf")]
        llama = plan.timed or plan.quantizer == LLAMA_CPP
        return digest(
            "shipped", RECORD, unit_key, self.export_dtype, gguf, plan.timed,
            _version("llama_cpp_python") if llama else None,
        )  # fmt: skip

    def file_key(self, unit_key: str, plan: Plan | None = None) -> str:
        """The key of the unit of key ``unit_key``'s GGUF file: what makes the file (the export
        dtype the model is written in, the GGUF type and who writes it, their versions), for
        what is computed from the file alone (:mod:`geospec.prune.shipped_score`)."""
        from geospec.prune.gguf_quant import LLAMA_CPP

        plan = plan or self.plan()
        llama = _version("llama_cpp_python") if plan.quantizer == LLAMA_CPP else None
        return digest(
            "shipped-file", unit_key, self.export_dtype, plan.dtype, plan.quantizer,
            _version("gguf"), llama,
        )  # fmt: skip


def ship_settings(
    prune: PruneSpec, reference: ReferenceSpec, spec_dir: Path
) -> ShipSettings | None:
    """How the recommended models' files and speed are measured (with ``prune.select``; None
    without it)."""
    from geospec.prune.exports import export_dtype

    if prune.select is None:
        return None
    dtype = export_dtype(prune, reference, spec_dir)
    return ShipSettings(dtype, local_checkpoint(reference, spec_dir), prune.select.runtime)


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def shipped_path(run_dir: Path, keep: float) -> Path:
    return prune_keep_dir(run_dir, keep) / SHIPPED_FILE


def stored_shipped(path: Path, key: str) -> dict[str, Any] | None:
    """The record in ``path`` when it is intact and measured under ``key``."""
    if json_problem(path, *SHIPPED_FIELDS) is not None:
        return None
    stored = read_json(path)
    return dict(unsealed(stored)) if stored["key"] == key else None


def shipped(
    unit: Unit,
    unit_key: str,
    run_dir: Path,
    settings: ShipSettings,
    model_dir: Path | None,
    write_model: Callable[[Path], None],
    say: Callable[[str], None],
    score: Scorer | None = None,
) -> dict[str, Any]:
    """The record of what ``unit`` (a recommended one) ships as: reused from its keep
    fraction's shipped.json when that holds its key, measured and sealed there otherwise.
    ``model_dir``: the unit's exported model when the prune wrote it (for ``unit_key`` in the
    export dtype); else ``write_model`` writes it into the directory it is given. ``score``
    scores the GGUF file as shipped (None: not scored)."""
    plan = settings.plan()
    key = settings.key(unit_key, plan)
    path = shipped_path(run_dir, unit.keep)
    found = stored_shipped(path, key)
    if found is not None:
        return found
    # (a damaged record was named by the stage's plan, which ran the stage for it)
    say(
        f"prune: measuring what the recommended {unit.arm}@{unit.keep:g} ships as (files"
        + ("; the GGUF file scored" if plan.dtype is not None and score is not None else "")
        + (f"; llama.cpp speed, {ROUNDS} rounds" if plan.timed else "")
        + ")"
    )
    scratch = prune_keep_dir(run_dir, unit.keep)
    record = measure(unit, settings, plan, model_dir, write_model, scratch, score)
    record = {"key": key, "unit_key": unit_key, **record}
    atomic_write_json(path, sealed(record))
    return record


def measure(
    unit: Unit,
    settings: ShipSettings,
    plan: Plan,
    model_dir: Path | None,
    write_model: Callable[[Path], None],
    scratch_in: Path,
    score: Scorer | None = None,
) -> dict[str, Any]:
    """The measurement itself (:func:`shipped` without the record): the files written into a
    temporary directory in ``scratch_in``, measured, removed."""
    scratch_in.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".shipping-", dir=scratch_in))
    try:
        model = model_dir
        if model is None:
            model = scratch / "model"
            try:
                write_model(model)
            except UsageError as error:  # a model no export can write: say so, keep the run
                return unexportable(unit, settings, str(error))
        record: dict[str, Any] = {
            "arm": unit.arm,
            "seed": unit.seed,
            "keep": unit.keep,
            "export_dtype": settings.export_dtype,
            "safetensors_bytes": sum(f.stat().st_size for f in sorted(model.glob("*.safetensors"))),
        }
        target = scratch / gguf_file_name(unit.arm, unit.keep)
        record["gguf"] = _gguf(model, target, settings, plan)
        record["score"] = _score(score, model, target, record["gguf"])
        if plan.timed and "skipped" not in record["gguf"]:
            record["speed"] = _speed(target, settings)
        else:  # the writer may have refused the model: nothing to time then either
            record["speed"] = {"skipped": plan.no_speed or NO_GGUF}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return record


def unexportable(unit: Unit, settings: ShipSettings, why: str) -> dict[str, Any]:
    """The record of a recommended model its export refused (a repair's bias is not a reason:
    every family's true-width export carries it): no files, and the writer's one line as the
    reason, which the report's What to ship line shows instead of sizes (not a failure of the
    whole prune, found only after every unit was computed)."""
    return {
        "arm": unit.arm,
        "seed": unit.seed,
        "keep": unit.keep,
        "export_dtype": settings.export_dtype,
        "safetensors_bytes": None,
        "unexportable": why,
        "gguf": {"skipped": NO_GGUF},
        "score": {"skipped": NO_GGUF_SCORE},
        "speed": {"skipped": NO_GGUF},
    }


def _gguf(model: Path, target: Path, settings: ShipSettings, plan: Plan) -> dict[str, Any]:
    """The GGUF file's sizes (:class:`~geospec.prune.gguf_size.GGUFSize`), or why there are
    none: the plan's reason, or the writer's one line (a family it does not map)."""
    if plan.dtype is None:
        return {"skipped": plan.no_gguf}
    from geospec.prune.exports import unit_gguf
    from geospec.prune.gguf_quant import block_size, source_stored_types, stored_types
    from geospec.prune.gguf_size import gguf_size

    source = settings.gguf_source
    assert source is not None
    try:
        written, _ = unit_gguf(model, target, source, source, plan.dtype)
    except UsageError as error:
        return {"skipped": str(error)}
    size = gguf_size(target, source)
    kind = written.dtype if written.dtype in ("f32", "f16") else written.dtype.upper()
    stored = stored_types(target, written.dtype)
    record = {
        "file": target.name,
        "type": kind,
        "quantizer": written.quantizer,
        "bytes": size.bytes,
        "source_bytes": size.source_bytes,
        "source_type": size.source_type,
        "f16_bytes": size.f16_bytes,
        "block": block_size(written.dtype),
        "matrices": dict(sorted(stored.matrices.items())),
        "ffn_matrices": dict(sorted(stored.ffn.items())),
        "ffn_fallbacks": dict(sorted(stored.ffn_fallbacks.items())),
    }
    # the source file's own fallbacks in the same type: a model whose rows are not whole blocks
    # (Qwen2.5-0.5B's d_model of 896 on 256s) falls back in its source too
    in_source = source_stored_types(source, written.dtype)
    if in_source is not None:
        record["source_ffn_fallbacks"] = dict(sorted(in_source.ffn_fallbacks.items()))
    return record


def _score(
    score: Scorer | None, model: Path, target: Path, gguf: Mapping[str, Any]
) -> dict[str, Any]:
    """The GGUF file scored as shipped beside the float32 model (nats on the selection windows),
    or why it is not."""
    if "skipped" in gguf:
        return {"skipped": NO_GGUF_SCORE}
    if score is None:
        return {"skipped": "no selection windows to score it on"}
    losses = score(model, target)
    return {**losses, "difference": float(losses["shipped"]) - float(losses["float32"])}


def _speed(target: Path, settings: ShipSettings) -> dict[str, Any]:
    """llama.cpp's prompt and generation speed on the GGUF file and on its source, round-robin
    (or why there is none: llama.cpp could not run one of them)."""
    from geospec.prune.runtime import compare_speeds, machine_load

    source = settings.gguf_source
    assert source is not None
    load = machine_load()  # before the timing: its own threads are not the machine's load
    try:
        ours, theirs = compare_speeds([target, source], THREADS, PROMPT, GENERATE, ROUNDS)
    except (ValueError, RuntimeError, OSError) as error:  # llama-cpp-python's load failures
        return {"skipped": f"llama.cpp could not run the files: {error}"}
    return {
        "threads": THREADS,
        "rounds": ROUNDS,
        "prompt_tokens": PROMPT,
        "generated_tokens": GENERATE,
        # the best of the rounds, then their median
        "prompt": ours.best.prompt,
        "generation": ours.best.generation,
        "source_prompt": theirs.best.prompt,
        "source_generation": theirs.best.generation,
        "prompt_median": ours.median.prompt,
        "generation_median": ours.median.generation,
        "source_prompt_median": theirs.median.prompt,
        "source_generation_median": theirs.median.generation,
        **(load.record() if load is not None else {}),
        "llama_cpp": _version("llama_cpp_python"),
    }


def stale_shipped(record: Mapping[str, Any], stage_key: str, settings: ShipSettings) -> bool:
    """Whether prune.json (``record``) lacks a recommended model's ``shipped``, or holds one
    measured under another key than the recommended unit's under ``settings`` (the export dtype,
    select.runtime, llama-cpp-python installed since): the stage measures again, the units
    reused."""
    from geospec.prune.units import Unit, unit_key

    seeds = record.get("seeds") or []
    plan = settings.plan()
    for budget in record.get("budgets", []):
        chosen = budget.get("recommended")
        if chosen is None or not seeds:
            continue
        recorded = chosen.get("shipped")
        unit = Unit(budget["keep"], chosen["arm"], int(seeds[0]))
        if not isinstance(recorded, dict) or recorded.get("key") != settings.key(
            unit_key(stage_key, unit), plan
        ):
            return True
    return False


def untrusted_shipped(run_dir: Path, record: Mapping[str, Any]) -> dict[float, str]:
    """The keep fractions whose shipped.json cannot back what prune.json (``record``) holds,
    each with why: missing, damaged, changed after geospec wrote it, or not what prune.json
    records (edited and sealed again). The stage measures them again."""
    found = {}
    for budget in record.get("budgets", []):
        recorded = (budget.get("recommended") or {}).get("shipped")
        if not isinstance(recorded, dict):
            continue
        keep = budget["keep"]
        path = shipped_path(run_dir, keep)
        problem = json_problem(path, *SHIPPED_FIELDS)
        if problem is None and dict(unsealed(read_json(path))) != recorded:
            problem = f"{SHIPPED_FILE} does not hold what prune.json records"
        if problem is not None:
            found[keep] = f"prune/keep-{keep:g}/{problem}"
    return found
