"""The eval stage: every trained arm x seed, and every pruned model a ``[prune]`` exports,
scored on lm-eval tasks (``[eval]``; the ``eval`` extra), between train and report.

Each finished run is exported as a transformers checkpoint (:mod:`geospec.engine.export`) into
a temporary directory, scored by lm-evaluation-harness (:mod:`geospec.evaluate.harness`), and its
scores are written, sealed, to ``arms/<arm>/seed-<k>/eval.json`` with the key they belong to: the
run's training key, the eval settings that change scores (tasks, include, limit, num_fewshot;
not batch_size) and the content of the local task folders. A run whose eval.json holds that key
(and was not changed after it was written) is not evaluated again. Runs not trained yet (held
by another process) are left for a later run; the stage then stays unfinished.

A prune unit whose model the prune exports (``prune.export``) is scored from that ``model/``,
read at its true per-layer widths (:func:`geospec.load_pruned`), into the unit's own sealed
``prune/keep-<f>/<arm>/seed-<k>/eval.json``, keyed by the unit's export mark (its key and dtype)
and the same eval settings (:mod:`geospec.prune.evaluation`); a unit not exported yet (``geospec
prune --arms/--keep`` left it out) is left for a later run likewise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from geospec.pipeline.context import INCOMPLETE, Plan, RunContext, Upstream
from geospec.pipeline.keys import arm_run_key, digest, section
from geospec.pipeline.run_dir import is_trained
from geospec.rundir.artifacts import json_problem, read_json
from geospec.rundir.layout import EVAL_FILE, arm_seed_dir
from geospec.spec.sections import DataSpec, EvalSpec, ModelSpec, PruneSpec, Spec, TrainSpec

if TYPE_CHECKING:
    from geospec.evaluate.harness import Harness
    from geospec.prune.evaluation import UnitEval

#: Eval settings that change how an evaluation runs but not its scores (left out of keys).
BOOKKEEPING = ("batch_size",)


@dataclass(frozen=True)
class EvalRun:
    """One trained run to score: its arm, seed, training directory and eval key."""

    arm: str
    seed: int
    out: Path
    run_key: str
    key: str

    @property
    def name(self) -> str:
        return f"arm {self.arm}, seed {self.seed}"


def eval_problem(out: Path, key: str) -> str | None:
    """What keeps ``out/eval.json`` from holding the scores of ``key`` (None: it holds them)."""
    problem = json_problem(out / EVAL_FILE, "key", "run_key", "tasks")
    if problem is not None:
        return problem
    if read_json(out / EVAL_FILE)["key"] != key:
        return f"{EVAL_FILE} holds the scores of other settings"
    return None


@dataclass(frozen=True)
class Eval:
    name: ClassVar[str] = "eval"
    reads: ClassVar[tuple[str, ...]] = ("solve", "prune")
    model: ModelSpec
    data: DataSpec
    train: TrainSpec
    arms: tuple[str, ...]
    probe_only: bool
    evaluation: EvalSpec | None
    prune: PruneSpec | None = None
    """The prune whose exported models are scored too (None: no [prune])."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Eval:
        arms = tuple(a.name for a in spec.arms)
        return cls(spec.model, spec.data, spec.train, arms, spec.probe_only, spec.eval, spec.prune)

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        pruned = self.prune is not None and upstream.key("prune") is not None
        if self.evaluation is None or (self.probe_only and not pruned):
            return Plan(None)  # nothing to evaluate: no key is recorded, nothing is said
        from geospec.evaluate.harness import task_definitions_digest, task_dirs
        from geospec.prune.evaluation import unit_eval_problem, unit_evals

        settings = section(self.evaluation)
        for name in BOOKKEEPING:
            settings.pop(name, None)
        definitions = task_definitions_digest(task_dirs(self.evaluation, run.spec_dir))
        tasks_key = digest(settings, definitions)
        runs = []
        if not self.probe_only:
            widths: dict[str, list[int]] = upstream.output("solve")
            for seed in self.train.seeds:
                for arm in self.arms:
                    run_key = arm_run_key(self.model, self.data, self.train, widths[arm], seed)
                    out = arm_seed_dir(run.run_dir, arm, seed)
                    key = digest("eval", run_key, tasks_key)
                    runs.append(EvalRun(arm, seed, out, run_key, key))
        trained = [r for r in runs if is_trained(r.out, r.run_key)]
        todo = [r for r in trained if forced or eval_problem(r.out, r.key) is not None]
        units: list[UnitEval] = []
        if pruned:
            assert self.prune is not None
            prune_key = upstream.key("prune")
            assert prune_key is not None
            units = unit_evals(self.prune, prune_key, run.run_dir, tasks_key)
        exported = [u for u in units if u.key is not None]
        unit_todo = [
            u
            for u in exported
            if forced or (u.key is not None and unit_eval_problem(u.directory, u.key) is not None)
        ]
        # a spec without [prune] keeps its key (the units' part enters only where there are any)
        parts: list[Any] = [[r.key for r in runs]]
        if units:
            parts.append([[u.unit_key, u.key] for u in units])
        waiting = len(runs) - len(trained) + len(units) - len(exported)
        return Plan(
            digest("eval", *parts),
            run=lambda: self.evaluate(run, todo, unit_todo, waiting),
            current=not todo and not unit_todo and not waiting,
            note="[dim]✓ eval: every arm and seed"
            + (" and every pruned model" if units else "")
            + " is evaluated (skipped)[/]",
        )

    def evaluate(
        self, run: RunContext, todo: list[EvalRun], units: list[UnitEval], waiting: int
    ) -> Any:
        assert self.evaluation is not None
        if todo or units:
            from geospec.evaluate.harness import Harness

            harness = Harness.load(self.evaluation, run.spec_dir)
        if todo:
            tokens = run.token_data(self.data)  # the runs' tokenizer goes with each export
            for item in todo:
                problem = eval_problem(item.out, item.key)
                if item.out.joinpath(EVAL_FILE).exists() and problem is not None:
                    run.say(f"[yellow]![/] eval: {item.name}: {problem}; evaluating it again")
                self.evaluate_one(run, harness, item, tokens.directory)
        for unit in units:
            self.evaluate_unit(run, harness, unit)
        if waiting:
            run.say(
                f"[yellow]![/] eval: {waiting} run(s) or pruned model(s) are not trained or "
                "exported yet; they are evaluated by a later geospec run"
            )
            return INCOMPLETE
        return None

    def evaluate_unit(self, run: RunContext, harness: Harness, item: UnitEval) -> None:
        """Score one pruned unit's exported model; write its sealed eval.json."""
        from geospec.engine.train import resolve_device
        from geospec.prune.evaluation import load_for_eval, unit_eval_problem

        assert self.evaluation is not None and item.key is not None
        problem = unit_eval_problem(item.directory, item.key)
        if item.directory.joinpath(EVAL_FILE).exists() and problem is not None:
            run.say(f"[yellow]![/] eval: {item.name}: {problem}; evaluating it again")
        run.say(f"eval: {item.name}: {', '.join(self.evaluation.tasks)}")
        model, tokenizer = load_for_eval(item.model_dir, str(resolve_device(run.device)))
        scores = harness.evaluate_model(model, tokenizer)
        del model  # one pruned model in memory at a time
        self.write_scores(
            run, item.directory, {"unit_key": item.unit_key}, item.key, harness, scores
        )

    def evaluate_one(
        self, run: RunContext, harness: Harness, item: EvalRun, tokenizer_dir: Path
    ) -> None:
        """Export one run to a temporary directory, score it, write its sealed eval.json."""
        import tempfile

        from geospec.engine.export import export_training_dir
        from geospec.engine.train import resolve_device

        assert self.evaluation is not None
        run.say(f"eval: {item.name}: {', '.join(self.evaluation.tasks)}")
        with tempfile.TemporaryDirectory(prefix="geospec-eval-") as temporary:
            exported = Path(temporary) / "hf"
            export_training_dir(item.out, exported, tokenizer_dir)
            scores = harness.evaluate(exported, str(resolve_device(run.device)))
        self.write_scores(run, item.out, {"run_key": item.run_key}, item.key, harness, scores)

    def write_scores(
        self,
        run: RunContext,
        out: Path,
        scored: dict[str, str],
        key: str,
        harness: Harness,
        scores: dict[str, Any],
    ) -> None:
        """Write ``out/eval.json`` (sealed: the eval key, what was scored, the settings and the
        scores) and say the scores."""
        from geospec.storage.atomic import atomic_write_json
        from geospec.storage.digests import sealed

        assert self.evaluation is not None
        record = {
            "key": key,
            **scored,
            "lm_eval": harness.version,
            "limit": self.evaluation.limit,
            "num_fewshot": self.evaluation.num_fewshot,
            "tasks": scores,
        }
        atomic_write_json(out / EVAL_FILE, sealed(record))
        for task, entry in scores.items():
            shown = ", ".join(
                f"{metric} {value:.4g}" if value is not None else f"{metric} -"
                for metric, value in entry["metrics"].items()
            )
            run.say(f"  {task}: {shown} ({entry['samples']} examples)")
