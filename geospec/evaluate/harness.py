"""lm-evaluation-harness on one exported checkpoint (a trained arm's) or model object (a pruned
model read at its true widths): named tasks in, one number per metric out.

lm-eval (the ``eval`` extra) is imported only here, when an evaluation runs. Tasks are looked up
first among the local task folders alone (geospec's bundled tasks and the spec's
``eval.include``), so an offline task never waits for lm-eval to index its thousands of
built-in tasks; only a name not found there brings the built-in index in (hub tasks: their data
come through ``datasets``, from the hub or its cache).
"""

from __future__ import annotations

import difflib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.errors import UsageError
from geospec.evaluate.tasks import TASKS_DIR
from geospec.spec.sections import EvalSpec
from geospec.storage.digests import file_digest, json_digest

#: Entries of lm-eval's per-task results that are no metric.
NOT_METRICS = {"name", "alias", "sample_len", "samples"}


def task_dirs(evaluation: EvalSpec, spec_dir: Path) -> list[Path]:
    """The folders of task YAMLs lm-eval reads: geospec's bundled tasks and ``eval.include``
    (relative to the spec file), each checked to exist."""
    dirs = [TASKS_DIR]
    for i, name in enumerate(evaluation.include):
        path = (spec_dir / name).resolve()
        if not path.is_dir():
            raise UsageError(
                f"eval.include[{i}]: {path} is not a directory; give a folder of lm-eval task "
                "YAMLs, relative to the spec file"
            )
        dirs.append(path)
    return dirs


def task_definitions_digest(dirs: list[Path]) -> str:
    """A content hash of every file in the task folders (YAMLs, their data and helpers), so a
    changed local task is evaluated again."""
    files = {}
    for index, directory in enumerate(dirs):
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[f"{index}/{path.relative_to(directory)}"] = file_digest(path)
    return json_digest(files)


def metric_name(key: str) -> str:
    """lm-eval's ``"acc,none"`` is ``acc``; a metric under a named filter keeps it
    (``"exact_match,strict-match"``)."""
    metric, _, filter_name = key.partition(",")
    return metric if filter_name in ("", "none") else key


def scores_of(output: dict[str, Any]) -> dict[str, Any]:
    """Per task (and group) of ``simple_evaluate``'s output: its metrics (standard errors left
    out; a value that is not a finite number is None), whether higher is better for each (None
    when lm-eval does not say), and the number of examples scored."""
    tasks: dict[str, Any] = {}
    for task, entries in output["results"].items():
        directions = (output.get("higher_is_better") or {}).get(task) or {}
        samples = (output.get("n-samples") or {}).get(task) or {}
        metrics: dict[str, float | None] = {}
        higher: dict[str, bool | None] = {}
        for key, value in entries.items():
            if key in NOT_METRICS or "_stderr" in key or isinstance(value, str):
                continue
            name = metric_name(key)
            number = float(value) if isinstance(value, (int, float)) else math.nan
            metrics[name] = number if math.isfinite(number) else None
            direction = directions.get(key.partition(",")[0])
            higher[name] = bool(direction) if direction is not None else None
        tasks[task] = {
            "metrics": metrics,
            "higher_is_better": higher,
            "samples": samples.get("effective"),
        }
    return tasks


#: lm-eval's warnings that say nothing to a geospec user, by logger: one per example whose
#: context is longer than the model's window (lm-eval cuts it from the left, docs/pipeline.md;
#: with a small model, every example), the advice against the model object a pruned model is
#: handed over as (geospec passes none of the options it says are ignored), and an invitation
#: to pass options that the bundled task's loader does not take.
QUIET: dict[str, tuple[str, ...]] = {
    "lm_eval.models.huggingface": (
        "Combined length of context",
        "`pretrained` model kwarg is not of type `str`",
        "Passed an already-initialized model through `pretrained`",
    ),
    "lm_eval.api.task": ("Custom kwargs can be passed",),
}


def _quiet(record: logging.LogRecord) -> bool:
    message = str(record.msg)
    return not any(prefix in message for prefix in QUIET.get(record.name, ()))


@dataclass
class Harness:
    """lm-eval set up for one evaluation stage: its task index (built once) and settings."""

    evaluation: EvalSpec
    task_manager: Any
    version: str

    @classmethod
    def load(cls, evaluation: EvalSpec, spec_dir: Path) -> Harness:
        """lm-eval with the spec's tasks found (an unknown task name is a UsageError with a
        did-you-mean)."""
        try:
            import lm_eval
            import lm_eval.models.huggingface  # HFLM: needs lm-eval's hf extra (accelerate)
            from lm_eval.tasks import TaskManager
        except ImportError as error:
            raise UsageError(
                f"eval: lm-evaluation-harness is not installed with what it needs ({error.name} "
                'is missing); pip install "geospec[eval]" (or remove [eval] from the spec)'
            ) from None
        dirs = [str(d) for d in task_dirs(evaluation, spec_dir)]
        manager = TaskManager(include_path=dirs, include_defaults=False)
        if any(task not in manager.all_tasks for task in evaluation.tasks):
            manager = TaskManager(include_path=dirs, include_defaults=True)
        for i, task in enumerate(evaluation.tasks):
            if task not in manager.all_tasks:
                close = difflib.get_close_matches(task, manager.all_tasks, n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise UsageError(
                    f"eval.tasks[{i}]: lm-eval knows no task, group or tag {task!r}{hint} "
                    "(lm-eval ls tasks lists them; local tasks go in eval.include)"
                )
        return cls(evaluation, manager, getattr(lm_eval, "__version__", "unknown"))

    def evaluate(self, model_dir: Path, device: str) -> dict[str, Any]:
        """The scores of the transformers checkpoint in ``model_dir`` (:func:`scores_of`), in
        float32 on ``device``."""
        from lm_eval.models.huggingface import HFLM

        self._quiet()
        model = HFLM(
            pretrained=str(model_dir),
            device=device,
            dtype="float32",
            batch_size=self.evaluation.batch_size,
        )
        return self._scores(model)

    def evaluate_model(self, model: Any, tokenizer: Any) -> dict[str, Any]:
        """The scores of a transformers model object (a pruned model read at its uneven widths,
        which plain ``from_pretrained`` cannot build) with its tokenizer, on the model's device
        and in its dtype, handed to lm-eval's HFLM as they are."""
        from lm_eval.models.huggingface import HFLM

        self._quiet()
        wrapped = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=self.evaluation.batch_size)
        return self._scores(wrapped)

    @staticmethod
    def _quiet() -> None:
        for name in QUIET:
            logging.getLogger(name).addFilter(_quiet)

    def _scores(self, model: Any) -> dict[str, Any]:
        """lm-eval's ``simple_evaluate`` of ``model`` (an HFLM) on the spec's tasks."""
        from lm_eval import simple_evaluate

        spec = self.evaluation
        output = simple_evaluate(
            model=model,
            tasks=list(spec.tasks),
            task_manager=self.task_manager,
            num_fewshot=spec.num_fewshot,
            limit=spec.limit,
            log_samples=False,
            bootstrap_iters=0,  # geospec's intervals come from the seeds, not from lm-eval
        )
        if output is None:  # only on a non-zero rank of lm-eval's own distributed mode
            raise UsageError("eval: lm-eval returned no results")
        return scores_of(output)
