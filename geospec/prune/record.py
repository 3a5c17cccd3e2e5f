"""What a prune records once every unit is computed: ``prune.json``'s content (every unit
gathered per keep fraction and arm beside the unpruned model's losses and parameters, each
grid's best setting) and, with ``prune.select``, each budget's recommendation (made on the
shipped files' losses with ``select.shipped``), its continuations, its ``best@KEEP`` exports and
what it ships as."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.kinds import ModelDims
from geospec.prune.continuations import recommended_continuations
from geospec.prune.unit_export import export_finished
from geospec.prune.unit_search import searched_summary
from geospec.prune.units import Unit, has_model, waiting_note
from geospec.prune.units import unit_key as key_of
from geospec.rundir.layout import UNIT_MODEL_DIR
from geospec.spec.sections import PruneSpec
from geospec.storage.locks import claim

if TYPE_CHECKING:
    from torch import nn

    from geospec.measure.probe import FFNSite
    from geospec.prune.calibration import Calibration
    from geospec.prune.inputs import PruneInputs
    from geospec.prune.shipped import ShipSettings
    from geospec.prune.shipped_score import UnitFiles


@dataclass(frozen=True)
class Finished:
    """A prune's finished units (``results``: their records; every unit's by the time
    :meth:`record` runs), with what writes a finished unit's model again: the unpruned
    ``model``, its FFN ``sites``, its ``calibration`` (each unit's cut); ``dims``: each keep
    fraction's pruned model, ``width``: the pretrained FFN width."""

    model: nn.Module
    sites: Sequence[FFNSite]
    calibration: Calibration
    inputs: PruneInputs
    results: Mapping[Unit, Mapping[str, Any]]
    dims: Mapping[float, ModelDims]
    width: int
    run_dir: Path
    selection: Sequence[Any] | None
    say: Callable[[str], None]

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

    def record(
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


def gather(
    prune: PruneSpec,
    dims: Mapping[float, ModelDims],
    reference: Mapping[str, float],
    results: Mapping[Unit, Mapping[str, Any]],
    width: int,
    layers: int,
) -> dict[str, Any]:
    """prune.json's content: per keep fraction, every arm's widths, FFN parameters and losses
    per calibration seed and corpus (and each eval window's, where every unit recorded them;
    a search's fitness per generation and whether it moved, where its units recorded them)."""
    budgets = []
    for keep in prune.fractions:
        arms: dict[str, dict[str, Any]] = {}
        for arm in prune.arms:
            units = {seed: results[Unit(keep, arm.name, seed)] for seed in prune.calibration.seeds}
            first = next(iter(units.values()))
            arms[arm.name] = {
                "widths": {str(seed): unit["widths"] for seed, unit in units.items()},
                "ffn_params": {str(seed): unit["ffn_params"] for seed, unit in units.items()},
                "loss": {
                    corpus: {str(seed): unit["loss"][corpus] for seed, unit in units.items()}
                    for corpus in first["loss"]
                },
            }
            if all("window_loss" in unit for unit in units.values()):  # units since 0.2
                arms[arm.name]["window_loss"] = {
                    corpus: {str(s): unit["window_loss"][corpus] for s, unit in units.items()}
                    for corpus in first["window_loss"]
                }
            if arm.importance is not None:  # the arm's own, not the prune's
                arms[arm.name]["importance"] = arm.importance.model_dump(mode="json")
            if arm.compensate is not None:
                arms[arm.name]["compensate"] = arm.compensate
            if arm.repair is not None or arm.lstsq is not None or prune.refits(arm):
                arms[arm.name]["repair"] = prune.repair_of(arm)  # the arm's, or the prune's
            if prune.refits(arm):  # how it was re-fitted
                arms[arm.name]["lstsq"] = prune.lstsq_of(arm).model_dump(mode="json")
            if arm.sweep is not None:  # a grid's arms are also scored on calibration text
                arms[arm.name]["calibration_loss"] = {
                    str(seed): unit["calibration_loss"] for seed, unit in units.items()
                }
            if prune.select is not None:  # the recommendation's windows (prune.select)
                arms[arm.name]["select_loss"] = {
                    str(seed): unit["select_loss"] for seed, unit in units.items()
                }
            if all("search" in unit for unit in units.values()):  # a search's path (evolve)
                arms[arm.name]["search"] = {
                    str(seed): searched_summary(unit["search"]) for seed, unit in units.items()
                }
            if "healed_loss" in first:
                arms[arm.name]["healed_loss"] = {
                    corpus: {str(s): unit["healed_loss"][corpus] for s, unit in units.items()}
                    for corpus in first["healed_loss"]
                }
        budget: dict[str, Any] = {
            "keep": keep,
            "uniform_width": dims[keep].ffn_width,
            "budget": dims[keep].budget,
            "multiple": dims[keep].multiple_of,
            "arms": arms,
        }
        if prune.sweeps:
            budget["sweeps"] = best_settings(prune.sweeps, arms)
        if prune.select is not None:
            from geospec.prune.select import recommend

            budget["recommended"] = recommend(arms, prune.select.windows)
        budgets.append(budget)
    return {
        "keep": prune.fractions,
        "baseline": prune.baseline,
        "importance": prune.importance.model_dump(mode="json"),
        "corpora": list(prune.eval.corpora),
        "windows": prune.eval.windows,
        "seeds": list(prune.calibration.seeds),
        "layers": layers,
        "width": width,
        "reference": dict(reference),
        "budgets": budgets,
    }


def best_settings(
    sweeps: Mapping[str, Sequence[str]], arms: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Each grid's best arm at one budget: the lowest calibration loss (training windows, never
    eval text) averaged over the calibration seeds (ties: the first in spec order), with every
    arm's mean."""
    best: dict[str, dict[str, Any]] = {}
    for sweep, names in sweeps.items():
        means = {
            name: sum(arms[name]["calibration_loss"].values()) / len(arms[name]["calibration_loss"])
            for name in names
        }
        best[sweep] = {"best": min(names, key=lambda name: means[name]), "calibration_loss": means}
    return best
