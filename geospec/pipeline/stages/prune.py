"""The prune stage: the pretrained reference cut to each budget with every [prune] arm's
allocation, each calibration seed, its held-out loss on every eval corpus (docs/prune.md).

Its section, its key, its artifacts, one library call (:func:`geospec.prune.study.prune_units`,
which writes each unit's ``prune/keep-<f>/<arm>/seed-<k>/result.json`` as it finishes, so an
interrupted prune resumes) and its record: ``prune.json`` (sealed) gathers the units with the
unpruned reference's losses. Healing trains through :func:`geospec.pipeline.training.train_into`,
like every training run (claimed, resumable, a failure recorded in the unit's ``heal/``:
:func:`geospec.pipeline.healing.healer`).

With ``prune.allocation_seeds``, calibration seed k re-draws the probe's token sample (as
``probe.seed = k`` draws it, from the probe's calibration split) and the diagnose and demand
stages' loss windows (drawn with seed k instead of the first ones), and measures every profile
the arms read on them again (:func:`geospec.pipeline.redraw.redrawn_profiles`), so every
profile-reading arm's widths move with the seed; the key then also holds the measure, diagnose
and demand stages' keys (the probe's settings, the measures, the diagnose and demand settings).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from geospec.pipeline.context import INCOMPLETE, Plan, RunContext, Upstream
from geospec.pipeline.healing import healer
from geospec.pipeline.keys import data_key
from geospec.pipeline.redraw import RedrawSettings, redrawn_profiles
from geospec.pipeline.stages.demand import DemandStage
from geospec.pipeline.stages.diagnose import Diagnose
from geospec.pipeline.stages.probe import Probe
from geospec.pipeline.stages.reference import compute_dtype, dtype_key
from geospec.prune.exports import export_dtype
from geospec.prune.shipped import (
    ship_settings,
    shipped_path,
    stale_shipped,
    untrusted_shipped,
)
from geospec.prune.shipped_score import chosen_on_stale
from geospec.prune.units import (
    chosen_units,
    is_finished,
    left_out_note,
    missing_exports,
    prune_key,
    recommended_arms,
    units_of,
)
from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import PRUNE_FILE
from geospec.rundir.records import PRUNE_KEYS
from geospec.spec.resolve import measures, prune_profiles
from geospec.spec.sections import (
    DataSpec,
    ModelSpec,
    PruneSpec,
    ReferenceSpec,
    Spec,
)
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import sealed

if TYPE_CHECKING:
    from geospec.prune.units import Unit


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
    redraw: RedrawSettings | None = None
    """How the profiles are measured, which prune.allocation_seeds does again for every seed."""

    @classmethod
    def from_spec(cls, spec: Spec) -> PruneStage:
        redraw = RedrawSettings(
            Probe.from_spec(spec), tuple(measures(spec)),
            Diagnose.from_spec(spec) if spec.diagnose.enabled else None,
            DemandStage.from_spec(spec) if spec.demand.enabled else None,
            spec.data,
        )  # fmt: skip
        return cls(spec.prune, spec.data, spec.model, spec.reference, spec.train.threads, redraw)

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        if self.prune is None:
            return Plan(None, current=True)
        every = upstream.profiles()
        # keyed by the profiles the arms read: a profile no arm uses changes no pruned model
        profiles = {name: every[name] for name in prune_profiles(self.prune) if name in every}
        # re-drawn profiles depend on the probe's settings, the measures and the diagnose and
        # demand settings, which those stages' keys hold (only then, so that the keys of
        # prunes without the option are unchanged)
        redrawn = (
            [upstream.key(name) for name in ("measure", "diagnose", "demand")]
            if self.prune.allocation_seeds
            else []
        )
        common = [upstream.key("reference"), data_key(self.data), self.model.seq_len,
                  self.model.multiple_of]  # fmt: skip
        computed_in = dtype_key(self.dtype(run), self.reference)
        key = prune_key(self.prune, common, profiles, redrawn, computed_in)
        path = run.run_dir / PRUNE_FILE
        # models asked for since the units finished: the stage runs, reusing every unit
        dtype = export_dtype(self.prune, self.reference, run.spec_dir)
        problem = json_problem(path, *PRUNE_KEYS) if path.exists() else None
        stored = read_json(path) if path.exists() and problem is None else None
        recommended = recommended_arms(stored) if stored is not None else None
        unwritten = (
            missing_exports(self.prune, key, run.run_dir, dtype, recommended)
            if self.prune.export
            else []
        )
        # what the recommended models ship as, measured again where it is stale (their
        # settings changed) or its record damaged; the units are reused
        ship = ship_settings(self.prune, self.reference, run.spec_dir)
        stale = False
        if ship is not None and stored is not None:
            stale = stale_shipped(stored, key, ship) or chosen_on_stale(stored, self.prune)
            untrusted = untrusted_shipped(run.run_dir, stored)
            problem = next(iter(untrusted.values()), None)
        return Plan(
            key,
            run=lambda: self.write(run, key, profiles),
            load=lambda: read_json(path),
            artifacts=(path,),
            problem=problem,
            current=False if unwritten or stale else None,
        )

    def dtype(self, run: RunContext) -> str:
        """The dtype the prune's forward passes compute in (prune.compute_dtype resolved)."""
        assert self.prune is not None
        requested = self.prune.compute_dtype
        return compute_dtype(run, requested, self.reference, "prune.compute_dtype")

    def write(self, run: RunContext, key: str, profiles: dict[str, list[float]]) -> Any:
        """Every unit (reused where its key matches), then prune.json; with ``geospec prune
        --arms/--keep``, the chosen units, and prune.json only once no other unit is missing
        (until then the stage is unfinished: :data:`INCOMPLETE`)."""
        from geospec.engine.precision import computing
        from geospec.pipeline.stages.reference import load_reference
        from geospec.prune.corpora import eval_batches
        from geospec.prune.heal import check_healable
        from geospec.prune.inputs import PruneInputs
        from geospec.prune.select import continuation_texts, prompt_ids, select_batches
        from geospec.prune.study import prune_units

        prune = self.prune
        assert prune is not None
        path = run.run_dir / PRUNE_FILE
        if prune.select is not None and json_problem(path, *PRUNE_KEYS) is None:
            # a record prune.json does not agree with is measured again, not reused
            for keep in untrusted_shipped(run.run_dir, read_json(path)):
                shipped_path(run.run_dir, keep).unlink(missing_ok=True)
        chosen = chosen_units(prune, run.prune_arms, run.prune_keep)
        dtype = export_dtype(prune, self.reference, run.spec_dir)
        todo = [u for u in units_of(prune) if not is_finished(prune, key, run.run_dir, u, dtype)]
        left_out = [unit for unit in todo if unit not in chosen]
        if left_out and len(left_out) == len(todo):  # the chosen ones are done: nothing to load
            return self.unfinished(run, left_out)
        model, d_model = load_reference(run, self.reference)
        check_healable(model, prune.heal)
        device = next(model.parameters()).device
        corpora = eval_batches(prune.eval, self.data, self.model.seq_len, run.token_data, device)
        selection = (
            select_batches(prune, self.data, self.model.seq_len, run.token_data, device)
            if prune.select is not None
            else None
        )
        data = run.token_data(self.data)
        redraw = (
            redrawn_profiles(run, model, d_model, set(profiles), self.redraw)
            if prune.allocation_seeds and self.redraw is not None
            else None
        )
        heal = (
            healer(run, prune.heal, self.model.seq_len, self.data, self.threads, corpora, model)
            if prune.heal.steps > 0
            else None
        )
        inputs = PruneInputs(
            prune, key, self.model.seq_len, self.model.multiple_of, self.model.activation,
            profiles, redraw=redraw, bos=data.bos_id, export_dtype=dtype,
            prompts=prompt_ids(data.tokenizer(), data.bos_id) if selection is not None else (),
            stop=data.eot_id, ship=ship_settings(prune, self.reference, run.spec_dir),
        )  # fmt: skip
        computed_in = self.dtype(run)
        with computing(computed_in, device):
            record = prune_units(
                model, d_model, inputs, data.train, corpora, run.run_dir,
                console=run.console, say=run.say,
                heal=heal,
                left_out=left_out,
                selection=selection,
            )  # fmt: skip
        if record is None:
            return self.unfinished(run, left_out)
        record = {**record, "key": key, "compute_dtype": computed_in, "seq_len": self.model.seq_len}
        record["arm_keys"] = getattr(key, "arms", {})  # each unit's key is its arm's
        if "continuations" in record:
            record["continuations"] = continuation_texts(record["continuations"], data.tokenizer())
        atomic_write_json(run.run_dir / PRUNE_FILE, sealed(record))
        return record

    def unfinished(self, run: RunContext, left_out: list[Unit]) -> Any:
        """Say which units --arms/--keep left out and how to compute them; the stage stays
        unfinished (its key unrecorded), so the next prune computes them, reusing the others."""
        run.say(f"[yellow]![/] prune: {left_out_note(left_out)}")
        # an older prune.json was gathered from other units (another key, or a unit since
        # lost): it must not be read as this prune's
        (run.run_dir / PRUNE_FILE).unlink(missing_ok=True)
        return INCOMPLETE
