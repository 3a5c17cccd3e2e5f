"""The prune stage: the pretrained reference cut to each budget with every [prune] arm's
allocation, each calibration seed, its held-out loss on every eval corpus (docs/prune.md).

Its section, its key, its artifacts, one library call (:func:`geospec.prune.study.prune_units`,
which writes each unit's ``prune/keep-<f>/<arm>/seed-<k>/result.json`` as it finishes, so an
interrupted prune resumes) and its record: ``prune.json`` (sealed) gathers the units with the
unpruned reference's losses. Healing trains through :func:`geospec.pipeline.training.train_into`,
like every training run (claimed, resumable, a failure recorded in the unit's ``heal/``).

With ``prune.allocation_seeds``, calibration seed k re-draws the probe's token sample (as
``probe.seed = k`` draws it, from the probe's calibration split) and the diagnose and demand
stages' loss windows (drawn with seed k instead of the first ones), and measures every profile
the arms read on them again (:meth:`PruneStage.redrawn_profiles`), so every profile-reading
arm's widths move with the seed; the key then also holds the measure, diagnose and demand
stages' keys (the probe's settings, the measures, the diagnose and demand settings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from geospec.artifacts import json_problem, read_json
from geospec.atomic import atomic_write_json
from geospec.digests import sealed
from geospec.errors import GeospecError
from geospec.layout import PRUNE_FILE
from geospec.pipeline.context import INCOMPLETE, Plan, RunContext, Upstream
from geospec.pipeline.keys import data_key, digest, section
from geospec.pipeline.run_dir import PRUNE_KEYS
from geospec.pipeline.stages.demand import DemandStage
from geospec.pipeline.stages.diagnose import Diagnose
from geospec.pipeline.stages.probe import Probe
from geospec.prune.units import chosen_units, is_finished, missing_exports, units_of
from geospec.spec.resolve import measures, prune_profiles
from geospec.spec.sections import (
    DIAGNOSTIC_PROFILES,
    DataSpec,
    MeasureSpec,
    ModelSpec,
    PruneSpec,
    ReferenceSpec,
    Spec,
    demand_profile_names,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

    from geospec.engine.distill import Teacher
    from geospec.engine.model import GPT, GPTConfig
    from geospec.prune.study import Healer
    from geospec.prune.units import Unit
    from geospec.spec.sections import TrainSpec


@dataclass(frozen=True)
class PruneStage:
    name: ClassVar[str] = "prune"
    reads: ClassVar[tuple[str, ...]] = ("reference", "measure", "diagnose", "demand")
    prune: PruneSpec | None
    data: DataSpec
    model: ModelSpec
    reference: ReferenceSpec
    threads: int | None = None
    """train.threads: torch's CPU threads while healing."""
    probe: Probe | None = None
    """The probe's settings, which prune.allocation_seeds draws again for every seed."""
    entries: tuple[MeasureSpec, ...] = ()
    """The measures in effect, which prune.allocation_seeds measures again for every seed."""
    diagnose: Diagnose | None = None
    """The diagnose stage's settings (when enabled), measured again for every seed likewise."""
    demand: DemandStage | None = None
    """The demand stage's settings (when enabled), measured again for every seed likewise."""

    @classmethod
    def from_spec(cls, spec: Spec) -> PruneStage:
        return cls(
            spec.prune, spec.data, spec.model, spec.reference, spec.train.threads,
            Probe.from_spec(spec), tuple(measures(spec)),
            Diagnose.from_spec(spec) if spec.diagnose.enabled else None,
            DemandStage.from_spec(spec) if spec.demand.enabled else None,
        )  # fmt: skip

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        if self.prune is None:
            return Plan(None, current=True)
        every = upstream.profiles()
        # keyed by the profiles the arms read: a profile no arm uses changes no pruned model
        profiles = {name: every[name] for name in self.needed_profiles() if name in every}
        # re-drawn profiles depend on the probe's settings, the measures and the diagnose and
        # demand settings, which those stages' keys hold (only then, so that the keys of
        # prunes without the option are unchanged)
        redrawn = (
            [upstream.key(name) for name in ("measure", "diagnose", "demand")]
            if self.prune.allocation_seeds
            else []
        )
        key = digest(
            "prune",
            # which units write their model, and in which dtype, is not what they compute: a
            # finished unit is exported without being recomputed (the key holds export = false
            # and the default dtype, what it held before, so those prunes keep their keys)
            section(self.prune.model_copy(update={"export": False, "export_dtype": "checkpoint"})),
            upstream.key("reference"),
            data_key(self.data),
            self.model.seq_len,
            self.model.multiple_of,
            {name: list(values) for name, values in sorted(profiles.items())},
            *redrawn,
            *self.block_arms(),
        )
        path = run.run_dir / PRUNE_FILE
        # models asked for since the units finished: the stage runs, reusing every unit
        unwritten = (
            missing_exports(self.prune, key, run.run_dir, self.export_dtype(run))
            if self.prune.export
            else []
        )
        return Plan(
            key,
            run=lambda: self.write(run, key, profiles),
            load=lambda: read_json(path),
            artifacts=(path,),
            problem=json_problem(path, *PRUNE_KEYS) if path.exists() else None,
            current=False if unwritten else None,
        )

    def block_arms(self) -> list[list[str]]:
        """The arms that allocate from every block linear's calibration inputs (``owl`` since it
        follows OWL's code), as one key part: the stage's key changes with what they compute,
        and a prune without them keeps its key."""
        from geospec.plugin import create_plugin

        assert self.prune is not None
        names = [
            arm.name
            for arm in self.prune.arms
            if getattr(create_plugin("schedule", arm.schedule), "reads_block_linears", False)
        ]
        return [names] if names else []

    def needed_profiles(self) -> list[str]:
        """The profiles the prune arms' schedules read (sorted)."""
        assert self.prune is not None
        return prune_profiles(self.prune)

    def write(self, run: RunContext, key: str, profiles: dict[str, list[float]]) -> Any:
        """Every unit (reused where its key matches), then prune.json; with ``geospec prune
        --arms/--keep``, the chosen units, and prune.json only once no other unit is missing
        (until then the stage is unfinished: :data:`INCOMPLETE`)."""
        from geospec.pipeline.stages.reference import load_reference
        from geospec.prune.corpora import eval_batches
        from geospec.prune.heal import check_healable
        from geospec.prune.study import PruneInputs, prune_units

        prune = self.prune
        assert prune is not None
        chosen = chosen_units(prune, run.prune_arms, run.prune_keep)
        dtype = self.export_dtype(run)
        todo = [u for u in units_of(prune) if not is_finished(prune, key, run.run_dir, u, dtype)]
        left_out = [unit for unit in todo if unit not in chosen]
        if left_out and len(left_out) == len(todo):  # the chosen ones are done: nothing to load
            return self.unfinished(run, left_out)
        model, d_model = load_reference(run, self.reference)
        check_healable(model, prune.heal)
        device = next(model.parameters()).device
        corpora = eval_batches(prune.eval, self.data, self.model.seq_len, run.token_data, device)
        data = run.token_data(self.data)
        redraw = (
            self.redrawn_profiles(run, model, d_model, set(profiles))
            if prune.allocation_seeds
            else None
        )
        inputs = PruneInputs(
            prune, key, self.model.seq_len, self.model.multiple_of, self.model.activation,
            profiles, redraw=redraw, bos=data.bos_id, export_dtype=dtype,
        )  # fmt: skip
        record = prune_units(
            model, d_model, inputs, data.train, corpora, run.run_dir,
            console=run.console, say=run.say,
            heal=self.healer(run, corpora, model) if prune.heal.steps > 0 else None,
            left_out=left_out,
        )  # fmt: skip
        if record is None:
            return self.unfinished(run, left_out)
        atomic_write_json(run.run_dir / PRUNE_FILE, sealed({**record, "key": key}))
        return record

    def export_dtype(self, run: RunContext) -> str:
        """The dtype pruned models are written in: ``prune.export_dtype``, where "checkpoint"
        is the dtype the checkpoint's config.json declares (a GGUF file, which declares none,
        or another: ``reference.dtype``, the dtype the model is computed in)."""
        from geospec.engine.pretrained import DTYPES
        from geospec.spec.checkpoint_shape import read_checkpoint_facts

        assert self.prune is not None
        if self.prune.export_dtype != "checkpoint":
            return self.prune.export_dtype
        checkpoint = self.reference.checkpoint
        facts = (
            read_checkpoint_facts(checkpoint, self.reference.revision, run.spec_dir)
            if checkpoint is not None
            else None
        )
        declared = None if facts is None else facts.dtype
        return declared if declared in DTYPES else self.reference.dtype

    def unfinished(self, run: RunContext, left_out: list[Unit]) -> Any:
        """Say which units --arms/--keep left out and how to compute them; the stage stays
        unfinished (its key unrecorded), so the next prune computes them, reusing the others."""
        seeds: dict[str, list[int]] = {}  # by ARM@KEEP, as --export names a unit group
        for unit in left_out:
            seeds.setdefault(f"{unit.arm}@{unit.keep:g}", []).append(unit.seed)
        names = ", ".join(
            f"{name} (seed {', '.join(map(str, found))})" for name, found in seeds.items()
        )
        run.say(
            f"[yellow]![/] prune: {len(left_out)} unit(s) not chosen by --arms/--keep are not "
            f"computed: {names}; prune.json and the report wait for them. Run the same command "
            "without --arms and --keep to compute them (the units computed so far are reused)"
        )
        # an older prune.json was gathered from other units (another key, or a unit since
        # lost): it must not be read as this prune's
        (run.run_dir / PRUNE_FILE).unlink(missing_ok=True)
        return INCOMPLETE

    def redrawn_profiles(
        self, run: RunContext, model: nn.Module, width: int, needed: set[str]
    ) -> Callable[[int], dict[str, list[float]]]:
        """Calibration seed k's own measurement of the profiles of ``needed``: the probe's
        sample drawn as ``probe.seed = k`` draws it (from the probe's calibration split) and
        probed on ``model``; the measured profiles on it as the measure stage measures them
        (the mean over replicates), so the probe's own seed gives the run's back; the
        diagnostic ones on those clouds and on diagnose's windows drawn with seed k; the
        demand ones on demand's windows drawn with seed k (its ordering calibrated on the
        seed's probe windows). One process measures them (the prune stage runs on rank 0)."""
        from geospec.engine.distributed import DistContext
        from geospec.engine.train import resolve_device
        from geospec.measure import demand_record, diagnostics
        from geospec.measure.work import measure_profiles, measure_replicates

        assert self.probe is not None
        entries = [entry for entry in self.entries if entry.profile in needed]
        diagnostic = needed & set(DIAGNOSTIC_PROFILES) if self.diagnose is not None else set()
        demand = (
            needed & set(demand_profile_names(self.demand.demand))
            if self.demand is not None
            else set()
        )
        data = run.token_data(self.data)
        device = resolve_device(run.device, run.dist.local_rank)
        alone = replace(run, dist=DistContext())

        def profiles(seed: int) -> dict[str, list[float]]:
            assert self.probe is not None
            probe = replace(
                self.probe, probe=self.probe.probe.model_copy(update={"seed": seed}), loss_seed=seed
            )
            found: dict[str, list[float]] = {}
            clouds = None
            if entries or diagnostic:
                clouds = probe.clouds(model, width, data, probe.sample(data))
            if entries and clouds is not None:
                replicates = probe.probe.replicates
                if replicates == 1:
                    found.update(measure_profiles(clouds, entries, progress=False, device=device))
                else:
                    measured = measure_replicates(
                        clouds, replicates, entries, progress=False, device=device
                    )
                    found.update(
                        {
                            name: [sum(layer) / len(layer) for layer in zip(*values, strict=True)]
                            for name, values in measured.items()
                        }
                    )
            if diagnostic and self.diagnose is not None:
                reference = replace(self.diagnose, probe=probe).measure_reference(alone, clouds)
                found.update(diagnostics.profiles_of(reference["layers"]))
            if demand and self.demand is not None:
                keep = self.demand.demand.keep
                cuts = replace(self.demand, probe=probe).measure_reference(alone)
                found.update(
                    demand_record.profiles_of(demand_record.fitted(cuts["layers"], keep), keep)
                )
            run.say(f"prune: seed {seed}: {len(found)} profiles measured on its own windows")
            return {name: values for name, values in found.items() if name in needed}

        return profiles

    def healer(
        self, run: RunContext, corpora: dict[str, list[Any]], reference: nn.Module
    ) -> Healer:
        """How a unit's pruned model is healed: trained into its ``heal/`` like any run (with
        ``heal.distill``, distilling from ``reference``, the unpruned model)."""
        from geospec.pipeline.training import TrainingJob, train_into
        from geospec.prune.heal import heal_settings, healed_losses, teacher_of

        assert self.prune is not None
        heal = self.prune.heal
        teachers: list[Teacher] = []  # imported once, at the first healing that needs it

        def teacher() -> Teacher | None:
            if heal.distill == 0:
                return None
            if not teachers:
                teachers.append(teacher_of(reference, self.model.seq_len, heal))
            return teachers[0]

        def train(
            config: GPTConfig,
            initial: dict[str, torch.Tensor],
            settings: TrainSpec,
            out: Path,
            key: str,
            seed: int,
        ) -> bool:
            data = run.token_data(self.data)
            job = TrainingJob(
                out, key, list(config.ffn_widths), config, settings, data, seed,
                initial=initial, teacher=teacher(),
            )  # fmt: skip
            trained = train_into(run, job, progress=False)
            return trained is not None

        def healed(unit: Unit, out: Path, key: str, imported: GPT) -> dict[str, float]:
            settings = heal_settings(heal, unit.seed, run.device, self.threads, self.model.seq_len)
            losses = healed_losses(imported, settings, out, key, unit.seed, train, corpora)
            if losses is None:
                raise GeospecError(
                    f"prune: {out} is being healed by another process; wait for it to finish "
                    "and run again"
                )
            return losses

        return healed
