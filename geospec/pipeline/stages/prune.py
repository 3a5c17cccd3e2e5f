"""The prune stage: the pretrained reference cut to each budget with every [prune] arm's
allocation, each calibration seed, its held-out loss on every eval corpus (docs/prune.md).

For calibration seed k the importance scores (and each layer's neuron ordering) come from
calibration sample k of the training split; every arm's widths at each keep fraction come from
:func:`geospec.prune.allocate.allocate` (the run's profiles for schedules that read them, the
scores for flap and owl); the reference keeps, in layer l, the ``widths[l]`` best neurons, and its
mean next-token loss is measured on the first ``eval.windows`` validation windows of each corpus.

Each unit (keep x arm x seed) writes ``prune/keep-<f>/<arm>/seed-<k>/result.json`` (sealed; its
key names what it was computed from) and, with ``export``, the pruned model beside it as a
transformers checkpoint (``model/``); a rerun keeps the units whose key matches, so an interrupted
prune resumes. ``prune.json`` (sealed) gathers them with the unpruned reference's losses.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from geospec.artifacts import json_problem, read_json
from geospec.atomic import atomic_write_json
from geospec.digests import seal_broken, sealed, unsealed
from geospec.disk import writing
from geospec.errors import UsageError
from geospec.layout import PRUNE_DIR, PRUNE_FILE
from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import data_key, digest, section
from geospec.pipeline.run_dir import PRUNE_KEYS
from geospec.spec.sections import DataSpec, ModelSpec, PruneSpec, ReferenceSpec, Spec

if TYPE_CHECKING:
    from geospec.engine.token_data import TokenData


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

    @classmethod
    def from_spec(cls, spec: Spec) -> PruneStage:
        return cls(spec.prune, spec.data, spec.model, spec.reference, spec.train.threads)

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        if self.prune is None:
            return Plan(None, current=True)
        every = upstream.profiles()
        # keyed by the profiles the arms read: a profile no arm uses changes no pruned model
        profiles = {name: every[name] for name in self.needed_profiles() if name in every}
        key = digest(
            "prune",
            section(self.prune),
            upstream.key("reference"),
            data_key(self.data),
            self.model.seq_len,
            self.model.multiple_of,
            {name: list(values) for name, values in sorted(profiles.items())},
        )
        path = run.run_dir / PRUNE_FILE
        return Plan(
            key,
            run=lambda: self.write(run, key, profiles),
            load=lambda: read_json(path),
            artifacts=(path,),
            problem=json_problem(path, *PRUNE_KEYS) if path.exists() else None,
        )

    def needed_profiles(self) -> list[str]:
        """The profiles the prune arms' schedules read (sorted)."""
        from geospec.plugin import create_plugin

        assert self.prune is not None
        names: set[str] = set()
        for arm in self.prune.arms:
            schedule = create_plugin("schedule", arm.schedule)
            if not schedule.reads_neuron_scores:
                names.update(schedule.required_profiles())
        return sorted(names)

    def write(
        self, run: RunContext, key: str, profiles: Mapping[str, Sequence[float]]
    ) -> dict[str, Any]:
        """Every unit (reused where its key matches), then prune.json."""
        import torch

        from geospec.engine.progress import stage_progress
        from geospec.measure.cut import CutError, ffn_layout, ffn_width
        from geospec.measure.probe import find_ffn_sites
        from geospec.measure.sensitivity import logits_of
        from geospec.pipeline.stages.reference import load_reference
        from geospec.plugin import create_plugin
        from geospec.prune.allocate import allocate, pruned_dims
        from geospec.prune.apply import calibration_windows, eval_loss, neuron_scores

        prune = self.prune
        assert prune is not None
        model, d_model = load_reference(run, self.reference)
        corpora = self.eval_batches(run, next(model.parameters()).device)
        first = next(iter(corpora.values()))[0][0][:1]
        sites = find_ffn_sites(model, d_model, lambda: logits_of(model, first))
        try:
            ffn_layout(sites[0].ffn)
        except CutError as error:
            raise CutError(f"prune: the FFN of {type(sites[0].layer).__name__}: {error}") from None
        width = ffn_width(sites[0].ffn)
        if prune.heal.steps > 0:
            from geospec.engine.imported import import_problem

            problem = import_problem(model)
            if problem is not None:
                raise UsageError(
                    "prune.heal: healing fine-tunes the pruned models in geospec's engine, which "
                    f"cannot reproduce this checkpoint exactly ({problem}); set heal.steps = 0"
                )
        importance = create_plugin("importance", prune.importance)
        train = run.token_data(self.data).train
        seq_len = self.model.seq_len
        units = [
            (keep, arm.name, seed)
            for keep in prune.fractions
            for seed in prune.calibration.seeds
            for arm in prune.arms
        ]
        dims = {
            keep: pruned_dims(
                len(sites), d_model, width, self.model.multiple_of, keep, self.model.activation
            )
            for keep in prune.fractions
        }
        run.say(
            f"[bold]prune[/]: {len(sites)} layers of {width} neurons kept at "
            f"{', '.join(f'{k:g}' for k in prune.fractions)}; {len(prune.arms)} arms x "
            f"{len(prune.calibration.seeds)} calibration seeds; {importance.kind_name()} scores; "
            f"loss on {prune.eval.windows} windows of {', '.join(corpora)}"
        )
        with torch.no_grad():
            reference = {name: eval_loss(model, batches) for name, batches in corpora.items()}
        results: dict[tuple[float, str, int], dict[str, Any]] = {}
        with stage_progress(run.console, run.say, "pruned models", len(units)) as advance:
            for seed in prune.calibration.seeds:
                scored: tuple[list[list[float]], list[list[int]]] | None = None
                widths: dict[float, dict[str, list[int]]] = {}
                for keep in prune.fractions:
                    for arm in prune.arms:
                        unit_dir = unit_directory(run.run_dir, keep, arm.name, seed)
                        unit_key = digest("prune-unit", key, keep, arm.name, seed)
                        stored = finished_unit(unit_dir, unit_key, prune.export)
                        if stored is not None:
                            results[(keep, arm.name, seed)] = stored
                            advance(1)
                            continue
                        if scored is None:
                            starts = calibration_windows(
                                train, seq_len, prune.calibration.windows, seed
                            )
                            scored = neuron_scores(
                                model,
                                sites,
                                importance,
                                train,
                                starts,
                                seq_len,
                                prune.calibration.batch_size,
                            )
                        if keep not in widths:
                            widths[keep] = allocate(prune.arms, dims[keep], profiles, scored[0])
                        result = self.prune_unit(
                            run, model, sites, scored[1], widths[keep][arm.name], corpora,
                            unit_dir, seed, unit_key,
                        )  # fmt: skip
                        result.update(
                            {"keep": keep, "arm": arm.name, "seed": seed, "key": unit_key}
                        )
                        atomic_write_json(unit_dir / UNIT_FILE, sealed(result))
                        results[(keep, arm.name, seed)] = result
                        advance(1)
        record = gather(prune, dims, reference, results, width, len(sites))
        atomic_write_json(run.run_dir / PRUNE_FILE, sealed({**record, "key": key}))
        return record

    def prune_unit(
        self,
        run: RunContext,
        model: Any,
        sites: Sequence[Any],
        orders: Sequence[Sequence[int]],
        widths: Sequence[int],
        corpora: Mapping[str, Sequence[Any]],
        unit_dir: Path,
        seed: int,
        key: str,
    ) -> dict[str, Any]:
        """One pruned model: its losses, FFN parameters, (with export) checkpoint and (with
        heal.steps) its losses after fine-tuning."""
        import torch

        from geospec.engine.imported import import_llama
        from geospec.prune.apply import eval_loss, export_pruned, ffn_parameters, pruned

        assert self.prune is not None
        initial = None
        with torch.no_grad(), pruned(sites, orders, widths):
            losses = {name: eval_loss(model, batches) for name, batches in corpora.items()}
            params = ffn_parameters(sites)
            if self.prune.export:
                staging = unit_dir / "model.partial"
                shutil.rmtree(staging, ignore_errors=True)
                with writing(unit_dir / MODEL_DIR):  # a full disk: one line
                    try:
                        export_pruned(model, sites, widths, staging)
                    except BaseException:
                        shutil.rmtree(staging, ignore_errors=True)  # its space is needed
                        raise
                shutil.rmtree(unit_dir / MODEL_DIR, ignore_errors=True)
                staging.rename(unit_dir / MODEL_DIR)
            if self.prune.heal.steps > 0:
                initial = import_llama(model, self.model.seq_len)
        result = {"widths": list(widths), "ffn_params": params, "loss": losses}
        if initial is not None:
            result["healed_loss"] = self.heal(run, initial, corpora, unit_dir, seed, key)
        return result

    def heal(
        self,
        run: RunContext,
        imported: Any,
        corpora: Mapping[str, Sequence[Any]],
        unit_dir: Path,
        seed: int,
        key: str,
    ) -> dict[str, float]:
        """Fine-tune the imported pruned model on [data]'s training text (resumable, in
        ``heal/`` beside the unit's record: a directory of another unit key is emptied, one of
        the same key resumes) and measure it again on every corpus."""
        import torch

        from geospec.engine.checkpoint import load_model
        from geospec.engine.train import train_model
        from geospec.pipeline.run_dir import own_training_dir
        from geospec.prune.apply import eval_loss
        from geospec.spec.sections import TrainSpec

        assert self.prune is not None
        heal = self.prune.heal
        spec = TrainSpec(
            steps=heal.steps,
            batch_size=heal.batch_size,
            lr=heal.lr,
            warmup=heal.warmup,
            weight_decay=heal.weight_decay,
            seeds=[seed],
            device=run.device,
            threads=self.threads,
            eval_tokens=self.model.seq_len,
        )
        directory = unit_dir / HEAL_DIR
        own_training_dir(run, directory, key, list(imported.config.ffn_widths))
        state = {k: v.detach().clone() for k, v in imported.state_dict().items()}
        train_model(
            spec,
            imported.config,
            run.token_data(self.data),
            directory,
            seed,
            progress=False,
            initial=state,
        )
        healed = load_model(directory, next(iter(corpora.values()))[0][0].device)
        with torch.no_grad():
            return {name: eval_loss(healed, batches) for name, batches in corpora.items()}

    def eval_batches(self, run: RunContext, device: Any) -> dict[str, list[Any]]:
        """Each eval corpus's first validation windows, tokenized like [data]."""
        from geospec.measure.sensitivity import loss_batches, scored_text

        assert self.prune is not None
        result = {}
        for corpus in self.prune.eval.corpora:
            try:
                data: TokenData = run.token_data(eval_data(self.data, corpus))
            except UsageError as error:
                raise UsageError(f"prune.eval.corpora: {corpus!r}: {error}") from None
            tokens = scored_text(data.val, data.eot_id if self.data.end_of_text else None)
            needed = self.prune.eval.windows * self.model.seq_len + 1
            if len(tokens) < needed:
                raise UsageError(
                    f"prune.eval.corpora: {corpus!r} has {len(tokens)} validation tokens, fewer "
                    f"than {self.prune.eval.windows} windows of {self.model.seq_len} need; lower "
                    "prune.eval.windows or use a longer text"
                )
            result[corpus] = loss_batches(
                tokens,
                self.model.seq_len,
                self.prune.eval.windows,
                self.prune.eval.batch_size,
                device,
            )
        return result


def eval_data(data: DataSpec, corpus: str) -> DataSpec:
    """The data section of one eval corpus: [data]'s tokenizer and split, another text."""
    if corpus.startswith("bundled:") or corpus == data.source:
        return data.model_copy(update={"source": corpus, "files": None, "max_documents": None})
    return data.model_copy(update={"source": None, "files": [corpus], "max_documents": None})


#: A unit's record and its exported model, under prune/keep-<f>/<arm>/seed-<k>/.
UNIT_FILE = "result.json"
MODEL_DIR = "model"
HEAL_DIR = "heal"


def unit_directory(run_dir: Path, keep: float, arm: str, seed: int) -> Path:
    return run_dir / PRUNE_DIR / f"keep-{keep:g}" / arm / f"seed-{seed}"


def finished_unit(unit_dir: Path, key: str, export: bool) -> dict[str, Any] | None:
    """A unit's stored result when it was computed from ``key`` (and exported if asked)."""
    path = unit_dir / UNIT_FILE
    if json_problem(path, "widths", "loss", "key") is not None:
        return None
    stored = read_json(path)
    if stored.get("key") != key or seal_broken(stored):
        return None
    if export and not (unit_dir / MODEL_DIR / "config.json").exists():
        return None
    return dict(unsealed(stored))


def gather(
    prune: PruneSpec,
    dims: Mapping[float, Any],
    reference: Mapping[str, float],
    results: Mapping[tuple[float, str, int], Mapping[str, Any]],
    width: int,
    layers: int,
) -> dict[str, Any]:
    """prune.json's content: per keep fraction, every arm's widths, FFN parameters and losses
    per calibration seed and corpus."""
    budgets = []
    for keep in prune.fractions:
        arms = {}
        for arm in prune.arms:
            units = {seed: results[(keep, arm.name, seed)] for seed in prune.calibration.seeds}
            first = next(iter(units.values()))
            arms[arm.name] = {
                "widths": {str(seed): unit["widths"] for seed, unit in units.items()},
                "ffn_params": {str(seed): unit["ffn_params"] for seed, unit in units.items()},
                "loss": {
                    corpus: {str(seed): unit["loss"][corpus] for seed, unit in units.items()}
                    for corpus in first["loss"]
                },
            }
            if "healed_loss" in first:
                arms[arm.name]["healed_loss"] = {
                    corpus: {str(s): unit["healed_loss"][corpus] for s, unit in units.items()}
                    for corpus in first["healed_loss"]
                }
        budgets.append(
            {
                "keep": keep,
                "uniform_width": dims[keep].ffn_width,
                "budget": dims[keep].budget,
                "multiple": dims[keep].multiple_of,
                "arms": arms,
            }
        )
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
