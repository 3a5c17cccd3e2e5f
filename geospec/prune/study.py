"""Every unit of a prune (keep fraction x arm x calibration seed) computed or reused, in the
run directory's ``prune/`` (docs/prune.md): the loop over the units, and one unit's pruned model
measured (its losses, its export, its healing).

For calibration seed k the importance scores (and each layer's neuron ordering) come from
calibration sample k of the training split, once for each distinct importance the arms use (an
arm's own, or the prune's: :mod:`geospec.prune.calibration`, :mod:`geospec.prune.score`); every
arm's widths at each keep fraction come from :func:`geospec.prune.allocate.allocate` (the run's
profiles for schedules that read them, or, with ``prune.allocation_seeds``, the measured
profiles re-drawn for seed k; the arm's own importance scores for flap and owl_neuron, every
block linear's calibration inputs for owl; the calibration windows themselves for the searches,
greedy and evolve, whose state is kept in the unit's directory: :mod:`geospec.prune.unit_search`);
the reference keeps, in layer l, the ``widths[l]`` best neurons, repaired as the arm says
(:mod:`geospec.prune.cut`), and its mean next-token loss is measured on every eval corpus's
held-out windows. A unit whose record holds its key is reused (:mod:`geospec.prune.units`), so
an interrupted prune resumes.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.prune.arms import ArmReads, arm_reads
from geospec.prune.calibration import Calibration
from geospec.prune.continuations import recommended_continuations
from geospec.prune.cut import Cut, cut_to
from geospec.prune.unit_export import export_finished, export_healed, export_unit
from geospec.prune.unit_search import evolve_search, searched_path
from geospec.prune.units import Unit, finished_unit, gather, has_model, units_of
from geospec.prune.units import unit_key as key_of
from geospec.rundir.layout import HEAL_DIR, SEARCH_FILE, UNIT_FILE, UNIT_MODEL_DIR
from geospec.spec.sections import PruneSpec
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import sealed
from geospec.storage.locks import claim

if TYPE_CHECKING:
    import numpy as np
    import torch
    from rich.console import Console
    from torch import nn

    from geospec.engine.model import GPT
    from geospec.engine.progress import StageAdvance
    from geospec.kinds import ModelDims
    from geospec.measure.probe import FFNSite
    from geospec.measure.sensitivity import Batch
    from geospec.prune.score import Scored
    from geospec.prune.shipped import ShipSettings
    from geospec.prune.shipped_score import UnitFiles

#: Heals one unit's pruned model (imported into geospec's engine) in the given directory under
#: the unit's key and returns its loss on every eval corpus.
Healer = Callable[[Unit, Path, str, "GPT"], dict[str, float]]


@dataclass(frozen=True)
class PruneInputs:
    """What a prune is computed from besides the reference model and the text."""

    prune: PruneSpec
    key: str
    """The prune stage's key: every unit's key derives from it."""
    seq_len: int
    multiple_of: int
    activation: str
    profiles: Mapping[str, Sequence[float]]
    """The profiles the arms' schedules read."""
    redraw: Callable[[int], Mapping[str, Sequence[float]]] | None = None
    """With ``prune.allocation_seeds``: calibration seed k's own measurement of the profiles it
    can re-draw (a probe sample drawn with seed k, measured again); they replace the run's
    profiles of the same names for seed k's units. None: every seed reads ``profiles``."""

    def seed_profiles(self, seed: int) -> Mapping[str, Sequence[float]]:
        """The profiles calibration seed ``seed``'s allocations are solved from."""
        if self.redraw is None:
            return self.profiles
        redrawn = self.redraw(seed)
        return {name: redrawn.get(name, values) for name, values in self.profiles.items()}

    bos: int | None = None
    """The token every window starts with (the tokenizer's BOS, ``TokenData.bos_id``), or None."""
    export_dtype: str = "float32"
    """The dtype exported models are written in (``prune.export_dtype`` resolved)."""
    prompts: Sequence[Sequence[int]] = ()
    """With ``prune.select``: fixed prompts (token ids) the recommended models and the unpruned
    one continue greedily in prune.json, for a reader to see what a perplexity means."""
    stop: int | None = None
    """The token a continuation ends at (the tokenizer's end of text)."""
    ship: ShipSettings | None = None
    """With ``prune.select``: how each recommended model's files and speed are measured
    (:mod:`geospec.prune.shipped`); None measures nothing."""


def prune_units(
    model: nn.Module,
    d_model: int,
    inputs: PruneInputs,
    train_tokens: np.ndarray,
    corpora: Mapping[str, Sequence[Any]],
    run_dir: Path,
    *,
    console: Console,
    say: Callable[[str], None],
    heal: Healer | None,
    left_out: Collection[Unit] = (),
    selection: Sequence[Any] | None = None,
) -> dict[str, Any] | None:
    """Compute (or reuse) every unit but those ``left_out`` (``geospec prune --arms/--keep``),
    writing each unit's record as it finishes, and return ``prune.json``'s content
    (:func:`geospec.prune.units.gather`); None when units were left out, since it gathers every
    unit. With ``selection`` (``prune.select``'s windows, :mod:`geospec.prune.select`), every
    unit's loss on them too, and per budget the recommended arm."""
    from geospec.engine.progress import stage_progress
    from geospec.shapes.pruned import pruned_dims

    prune = inputs.prune
    sites, width = ffn_sites(model, d_model, corpora)
    reads = arm_reads(prune)
    calibration = Calibration(
        model, sites, prune, reads.importances, reads.arm_importance, train_tokens,
        inputs.seq_len, inputs.bos, run_dir, inputs.key, say,
        compensate=any(prune.compensates(arm) for arm in prune.arms), blocks=reads.blocks,
        batches=bool(reads.searches or reads.evolves or prune.sweeps),
    )  # fmt: skip
    dims = {
        keep: pruned_dims(len(sites), d_model, width, inputs.multiple_of, keep, inputs.activation)
        for keep in prune.fractions
    }
    say(
        f"[bold]prune[/]: {len(sites)} layers of {width} neurons kept at "
        f"{', '.join(f'{k:g}' for k in prune.fractions)}; {len(prune.arms)} arms x "
        f"{len(prune.calibration.seeds)} calibration seeds; {calibration.kinds} scores; "
        f"loss on {prune.eval.windows} windows of {', '.join(corpora)}"
    )
    reference, reference_select = unpruned_losses(model, corpora, selection, say)
    units = [unit for unit in units_of(prune) if unit not in left_out]
    pruning = Pruning(
        model, sites, inputs, corpora, run_dir, say, selection, calibration, reads, width, dims,
        wanted=reads.wanted(unit.arm for unit in units),  # the arms those units are or read
    )  # fmt: skip
    with stage_progress(console, say, "pruned models", len(units)) as advance:
        healing = None if heal is None else shown_alone(heal, advance)
        for unit in units:
            pruning.results[unit] = pruning.unit_record(unit, healing)
            advance(1)
    if left_out:
        return None
    return pruning.recorded(reference, reference_select)


def ffn_sites(
    model: nn.Module, d_model: int, corpora: Mapping[str, Sequence[Any]]
) -> tuple[list[FFNSite], int]:
    """The FFN of every decoder layer of ``model`` (found on the first eval window's first
    token), checked to be one geospec can cut, and the pretrained width."""
    from geospec.measure.cut import CutError, ffn_layout, ffn_width
    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of

    first = next(iter(corpora.values()))[0][0][:1]
    sites = find_ffn_sites(model, d_model, lambda: logits_of(model, first))
    try:
        ffn_layout(sites[0].ffn)
    except CutError as error:
        raise CutError(f"prune: the FFN of {type(sites[0].layer).__name__}: {error}") from None
    return sites, ffn_width(sites[0].ffn)


def unpruned_losses(
    model: nn.Module,
    corpora: Mapping[str, Sequence[Any]],
    selection: Sequence[Any] | None,
    say: Callable[[str], None],
) -> tuple[dict[str, float], float | None]:
    """The unpruned model's loss on every eval corpus, and on the selection windows (None
    without them)."""
    import torch

    from geospec.prune.losses import eval_loss

    # each of these passes takes seconds to minutes on a CPU: a line says which runs
    selected = "" if selection is None else f" and {len(selection)} batches of selection windows"
    windows = sum(len(batches) for batches in corpora.values())
    say(f"prune: the unpruned model's loss on {windows} batches of eval windows{selected}")
    with torch.no_grad():
        reference = {name: eval_loss(model, batches) for name, batches in corpora.items()}
        reference_select = None if selection is None else eval_loss(model, selection)
    return reference, reference_select


@dataclass
class Pruning:
    """One prune being computed: what its units read (the model and its FFN sites, the
    calibration samples, each keep fraction's dimensions, what the arms read) and what they have
    computed so far (the units' records, each calibration seed's widths and teachers)."""

    model: nn.Module
    sites: Sequence[FFNSite]
    inputs: PruneInputs
    corpora: Mapping[str, Sequence[Any]]
    run_dir: Path
    say: Callable[[str], None]
    selection: Sequence[Any] | None
    calibration: Calibration
    reads: ArmReads
    width: int
    """The pretrained FFN width."""
    dims: dict[float, ModelDims]
    """Each keep fraction's pruned model."""
    wanted: set[str]
    """The arms the units to compute are or read: the arms allocated."""
    results: dict[Unit, dict[str, Any]] = field(default_factory=dict)
    """Every unit's record so far."""
    teachers: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)
    """The unpruned model's outputs a search reads, by calibration seed and window."""
    profiles: dict[int, Mapping[str, Sequence[float]]] = field(default_factory=dict)
    """The profiles each calibration seed's allocations read, when needed."""
    widths: dict[tuple[int, float], dict[str, list[int]]] = field(default_factory=dict)
    """Every allocated arm's widths, by calibration seed and keep fraction."""

    def unit_record(self, unit: Unit, heal: Healer | None) -> dict[str, Any]:
        """The unit's record, reused where nothing is left to do for it, else computed under
        its claim."""
        unit_dir = unit.directory(self.run_dir)
        # owl's units from before it read the block linears are not reused: the stage's key
        # (inputs.key) names the arms that read them (prune.units.block_arms)
        unit_key = key_of(self.inputs.key, unit)
        result = self.reusable(unit, unit_dir, unit_key)
        if result is None:
            # another geospec prune on this run directory may be computing the unit: wait
            # for it and reuse its record rather than compute it twice (the claim is an
            # flock, released when its holder exits or dies)
            with claim(unit_dir, waiting=waiting_note(unit, self.say)):
                result = self.reusable(unit, unit_dir, unit_key)
                if result is None:
                    result = self.computed(unit, unit_dir, unit_key, heal)
        return result

    def reusable(self, unit: Unit, unit_dir: Path, unit_key: str) -> dict[str, Any] | None:
        """The unit's record when nothing is left to do for it (its model written, if asked)."""
        stored = finished_unit(unit_dir, unit_key)
        exported = not self.inputs.prune.exports(unit.keep, unit.arm) or has_model(
            unit_dir, unit_key, self.inputs.export_dtype
        )
        return stored if stored is not None and exported else None

    def computed(
        self, unit: Unit, unit_dir: Path, unit_key: str, heal: Healer | None
    ) -> dict[str, Any]:
        """The unit's record, computed (healed by ``heal``) or, finished before its model was
        asked for, its model written: this process holds the unit's claim."""
        stored = finished_unit(unit_dir, unit_key)
        if stored is not None:  # finished, its model asked for since: written, not redone
            self.write_model(unit, unit_dir, unit_key, stored)
            return stored
        prune = self.inputs.prune
        work = self.calibration.scored(unit.seed)
        self.say(f"prune: {unit.label}: allocating, cutting and scoring")
        arm = next(a for a in prune.arms if a.name == unit.arm)
        unit_widths = self.allocated(unit.seed, unit.keep, work)[unit.arm]
        result = pruned_unit(
            self.model, self.sites, self.calibration.cut(unit, unit_widths), unit_widths,
            self.corpora, unit, unit_dir, unit_key, self.inputs, heal,
            calibration=work.batches if arm.sweep is not None else None,
            export=prune.exports(unit.keep, unit.arm), selection=self.selection,
        )  # fmt: skip
        result.update({"keep": unit.keep, "arm": unit.arm, "seed": unit.seed})
        if unit.arm in self.reads.evolves:  # the search's path to its widths
            result["search"] = searched_path(unit_dir / SEARCH_FILE)
        if self.inputs.redraw is not None:  # what this seed's allocation was solved from
            result["profiles"] = {k: list(v) for k, v in self.profiles[unit.seed].items()}
        result["key"] = unit_key
        atomic_write_json(unit_dir / UNIT_FILE, sealed(result))
        return result

    def allocated(self, seed: int, keep: float, work: Scored) -> dict[str, list[int]]:
        """Every wanted arm's widths at ``keep`` for calibration seed ``seed`` (whose scores
        are ``work``), allocated once: the searches run here."""
        from geospec.prune.allocate import allocate
        from geospec.prune.search import SuffixCutLosses

        if (seed, keep) in self.widths:
            return self.widths[(seed, keep)]
        prune, reads = self.inputs.prune, self.reads
        arm_importance = reads.arm_importance
        if seed not in self.profiles:
            self.profiles[seed] = self.inputs.seed_profiles(seed)
        losses = {  # a search's calibration losses, of its own importance's cuts
            name: SuffixCutLosses(
                self.model, self.sites, work.orders[arm_importance[name]], work.batches or []
            )
            for name in reads.searches
        }
        searched = {}  # each evolve arm's search, resumable in its unit's directory
        for name in [name for name in reads.evolves if name in self.wanted]:
            searched[name] = evolve_search(
                self.model, self.sites, work.orders[arm_importance[name]], work.batches or [],
                self.teachers.setdefault(seed, {}), prune, self.run_dir, Unit(keep, name, seed),
                self.inputs.key, self.say,
                levels=functools.partial(self.calibration.levels, name, seed),
            )  # fmt: skip
        self.widths[(seed, keep)] = allocate(
            [arm for arm in prune.arms if arm.name in self.wanted], self.dims[keep],
            self.profiles[seed], [],
            arm_scores={arm: work.scores[key] for arm, key in arm_importance.items()},
            blocks=work.blocks, cut_losses=losses, searches=searched,
        )  # fmt: skip
        return self.widths[(seed, keep)]

    def write_model(
        self,
        unit: Unit,
        unit_dir: Path,
        unit_key: str,
        stored: Mapping[str, Any],
        target: Path | None = None,
    ) -> None:
        """A finished unit's model written without computing it again (its healed model,
        where it was healed), into its ``model/`` or into ``target``."""
        cut = self.calibration.cut(unit, stored["widths"])
        target = target or unit_dir / UNIT_MODEL_DIR
        export_finished(
            self.model, self.sites, cut, stored, unit_dir, target, unit_key,
            self.inputs.export_dtype,
        )  # fmt: skip

    def files_of(self, unit: Unit) -> UnitFiles:
        """A finished unit's model, for its GGUF file: its ``model/`` where the prune wrote it
        (in the export dtype), else what writes it into another directory."""
        from geospec.prune.shipped_score import UnitFiles

        unit_dir, unit_key = unit.directory(self.run_dir), key_of(self.inputs.key, unit)
        written = has_model(unit_dir, unit_key, self.inputs.export_dtype)
        write_into = functools.partial(self.write_model, unit, unit_dir, unit_key,
                                       self.results[unit])  # fmt: skip
        return UnitFiles(unit_dir, unit_key, unit_dir / UNIT_MODEL_DIR if written else None,
                         write_into)  # fmt: skip

    def recorded(
        self, reference: Mapping[str, float], reference_select: float | None
    ) -> dict[str, Any]:
        """prune.json's content, every unit computed: the units gathered beside the unpruned
        model's losses and parameters, and with ``prune.select`` each budget's recommendation,
        its continuations, exports and shipped files."""
        from geospec.prune.losses import ffn_parameters

        prune, inputs = self.inputs.prune, self.inputs
        record = gather(prune, self.dims, reference, self.results, self.width, len(self.sites))
        # the unpruned model's (a tied embedding once): an arm's total is this less the FFN
        # parameters it cut
        record["parameters"] = {
            "total": sum(p.numel() for p in self.model.parameters()),
            "ffn": ffn_parameters(self.sites),
        }
        if reference_select is not None:
            record["select_reference"] = reference_select
        if prune.select is not None and prune.select.shipped and inputs.ship is not None:
            self.recommend_shipped(record, inputs.ship)
        if inputs.prompts and any("recommended" in budget for budget in record["budgets"]):
            record["continuations"] = recommended_continuations(
                self.model, self.sites, record, inputs.prompts, inputs.stop, self.calibration.cut
            )
        self.export_best(record)
        if inputs.ship is not None:  # what each recommended model ships as, before any export
            self.measure_shipped(record, inputs.ship)
        say_sweeps(record, self.say)
        return record

    def recommend_shipped(self, record: dict[str, Any], ship: ShipSettings) -> None:
        """``prune.select.shipped``: each budget's recommendation made on every unit's GGUF
        file's losses on the selection windows."""
        from geospec.prune.gguf_weights import shipped_window_losses
        from geospec.prune.shipped_score import recommend_shipped

        assert self.selection is not None  # the recommendation is made on the files' losses
        by_window = functools.partial(shipped_window_losses, batches=self.selection)
        recommend_shipped(record, self.inputs.prune, ship, self.files_of, by_window, self.say)

    def export_best(self, record: Mapping[str, Any]) -> None:
        """``export = ["best@KEEP"]``: the recommended arm's models at KEEP written, every
        calibration seed's."""
        prune, inputs = self.inputs.prune, self.inputs
        for keep in prune.best_exports():
            budget = next(budget for budget in record["budgets"] if budget["keep"] == keep)
            for seed in prune.calibration.seeds:
                unit = Unit(keep, budget["recommended"]["arm"], seed)
                unit_dir, unit_key = unit.directory(self.run_dir), key_of(inputs.key, unit)
                if not has_model(unit_dir, unit_key, inputs.export_dtype):
                    with claim(unit_dir, waiting=waiting_note(unit, self.say)):
                        self.write_model(unit, unit_dir, unit_key, self.results[unit])
                    self.say(
                        f"prune: exported the recommended {unit.arm}@{keep:g} (seed {unit.seed})"
                    )

    def measure_shipped(self, record: Mapping[str, Any], ship: ShipSettings) -> None:
        """Each budget's recommended model (first calibration seed's): what it ships as."""
        from geospec.prune.gguf_weights import shipped_losses
        from geospec.prune.shipped import shipped

        # its GGUF file scored as shipped, on the windows the recommendation read
        score = (
            None if self.selection is None
            else functools.partial(shipped_losses, batches=self.selection)
        )  # fmt: skip
        for budget in record["budgets"]:
            if "recommended" not in budget:
                continue
            seed = self.inputs.prune.calibration.seeds[0]
            unit = Unit(budget["keep"], budget["recommended"]["arm"], seed)
            files = self.files_of(unit)
            budget["recommended"]["shipped"] = shipped(
                unit, files.key, self.run_dir, ship, files.model_dir, files.write_model, self.say,
                score,
            )  # fmt: skip


def say_sweeps(record: Mapping[str, Any], say: Callable[[str], None]) -> None:
    """A line per budget and sweep: the grid setting best on the calibration windows."""
    for budget in record["budgets"]:
        for sweep, found in budget.get("sweeps", {}).items():
            loss = found["calibration_loss"][found["best"]]
            say(
                f"prune: at keep {budget['keep']:g} the best of the {sweep!r} grid on the "
                f"calibration windows is {found['best']!r} (loss {loss:.4f})"
            )


def shown_alone(heal: Healer, advance: StageAdvance) -> Healer:
    """``heal`` with the units' bar off the screen, so that its training bar (step, loss,
    tokens/s, eta) is the one shown while it runs."""

    def healed(unit: Unit, directory: Path, key: str, imported: GPT) -> dict[str, float]:
        with advance.paused():
            return heal(unit, directory, key, imported)

    return healed


def waiting_note(unit: Unit, say: Callable[[str], None]) -> Callable[[Any], None]:
    """What a prune says when another process holds ``unit``'s claim, told the holder's record
    (:func:`geospec.storage.locks.claim_holder`: None, or one without a pid, when it cannot be
    read)."""
    import socket

    def waiting(holder: dict[str, Any] | None) -> None:
        who = ""
        if holder is not None and "pid" in holder:
            host = holder["host"]  # a pid is its host's own: the host is named where it differs
            where = "" if host == socket.gethostname() else f" on {host}"
            who = f" (pid {holder['pid']}{where})"
        say(f"waiting for unit {unit.label}: another geospec prune{who} is computing it")

    return waiting


def pruned_unit(
    model: nn.Module,
    sites: Sequence[FFNSite],
    cut: Cut,
    widths: Sequence[int],
    corpora: Mapping[str, Sequence[Any]],
    unit: Unit,
    unit_dir: Path,
    key: str,
    inputs: PruneInputs,
    heal: Healer | None,
    *,
    calibration: Sequence[Batch] | None = None,
    export: bool = False,
    selection: Sequence[Batch] | None = None,
) -> dict[str, Any]:
    """One pruned model (cut and repaired as ``cut`` says): its losses, FFN parameters, (with
    export) checkpoint (the healed model's, with a healer), (with a healer) its losses after
    healing and (with ``calibration``, a sweep's arm) its loss on the calibration windows."""
    import torch

    from geospec.engine.imported import import_llama
    from geospec.prune.losses import eval_loss, ffn_parameters, window_losses

    imported = None
    with torch.no_grad(), cut_to(sites, cut, widths):
        windows = {name: window_losses(model, batches) for name, batches in corpora.items()}
        losses = {name: sum(values) / len(values) for name, values in windows.items()}
        own = None if calibration is None else eval_loss(model, calibration)
        chosen_on = None if selection is None else window_losses(model, selection)
        params = ffn_parameters(sites)
        if export and heal is None:
            export_unit(model, sites, widths, unit_dir / UNIT_MODEL_DIR, key, inputs.export_dtype)
        else:  # an earlier computation's model is not this one's
            shutil.rmtree(unit_dir / UNIT_MODEL_DIR, ignore_errors=True)
        if heal is not None:
            imported = import_llama(model, inputs.seq_len)
    result: dict[str, Any] = {
        "widths": list(widths), "ffn_params": params, "loss": losses, "window_loss": windows,
    }  # fmt: skip
    if own is not None:
        result["calibration_loss"] = own
    if chosen_on is not None:  # what the recommendation reads (prune.select)
        result["select_loss"] = chosen_on
    if imported is not None and heal is not None:
        # healing trains in its own precision (train.precision), not the prune's compute dtype
        with torch.autocast(next(model.parameters()).device.type, enabled=False):
            result["healed_loss"] = heal(unit, unit_dir / HEAL_DIR, key, imported)
        if export:
            export_healed(
                model, sites, cut, widths, unit_dir / HEAL_DIR, unit_dir / UNIT_MODEL_DIR, key,
                inputs.export_dtype,
            )  # fmt: skip
    return result
