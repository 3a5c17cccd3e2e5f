"""The loop over a prune's units (keep fraction x arm x calibration seed), each computed or
reused in the run directory's ``prune/`` (docs/prune.md), and what it reads and writes in its
order, a step a module:

- before any unit, the unpruned model (:mod:`geospec.prune.unpruned`: its FFN sites and its
  losses), what the arms read (:mod:`geospec.prune.arms`)
  and each calibration sample's shared work (:mod:`geospec.prune.calibration`, scored once per
  seed by :mod:`geospec.prune.score`);
- per unit: every wanted arm's widths at its keep fraction, allocated once per seed and keep
  (:func:`geospec.prune.allocate.allocate`, with the searches' calibration losses and an
  ``evolve`` arm's search, :mod:`geospec.prune.search` and :mod:`geospec.prune.unit_search`),
  then its pruned model cut and repaired as its arm says and measured
  (:mod:`geospec.prune.unit_result`), its record written under its key; a unit whose record
  holds its key is reused (:mod:`geospec.prune.units`), so an interrupted prune resumes;
- once every unit is, ``prune.json``'s content and the recommendation's continuations, exports
  and shipped files (:mod:`geospec.prune.record`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.prune.arms import ArmReads, arm_reads
from geospec.prune.calibration import Calibration
from geospec.prune.inputs import PruneInputs
from geospec.prune.record import Finished
from geospec.prune.unit_result import pruned_unit
from geospec.prune.unit_search import evolve_search, searched_path
from geospec.prune.units import Unit, finished_unit, has_model, units_of, waiting_note
from geospec.prune.units import unit_key as key_of
from geospec.prune.unpruned import ffn_sites, unpruned_losses
from geospec.rundir.layout import SEARCH_FILE, UNIT_FILE
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
    from geospec.prune.heal import Healer
    from geospec.prune.score import Scored


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
    (:func:`geospec.prune.record.gather`); None when units were left out, since it gathers every
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
    return pruning.finished().record(reference, reference_select)


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
            self.finished().write_model(unit, unit_dir, unit_key, stored)
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

    def finished(self) -> Finished:
        """The units computed so far, as the prune's record reads them and with what writes a
        finished unit's model again (:mod:`geospec.prune.record`)."""
        return Finished(
            self.model, self.sites, self.calibration, self.inputs, self.results, self.dims,
            self.width, self.run_dir, self.selection, self.say,
        )  # fmt: skip


def shown_alone(heal: Healer, advance: StageAdvance) -> Healer:
    """``heal`` with the units' bar off the screen, so that its training bar (step, loss,
    tokens/s, eta) is the one shown while it runs."""

    def healed(unit: Unit, directory: Path, key: str, imported: GPT) -> dict[str, float]:
        with advance.paused():
            return heal(unit, directory, key, imported)

    return healed
