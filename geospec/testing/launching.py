"""The launcher and tracker contract checks (docs/plugins.md)."""

from __future__ import annotations

import functools
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.kinds import Launch, Launcher, RunOutcome, TrackedRun, Tracker, TrainingRun
from geospec.testing.contract import ContractError, plugin_instance, rule

#: The file :class:`QuickTrainer` appends one line to per call, in a run's training directory.
CALLS_FILE = "calls.txt"


@dataclass(frozen=True)
class QuickTrainer:
    """A picklable trainer of quick runs: records each call in the run's directory and writes a
    result that depends on the run alone, as a real trainer's does. Runs named in ``fails``
    raise instead (after recording the call), as a failing run does."""

    fails: tuple[str, ...] = ()

    def __call__(self, run: TrainingRun, threads: int | None = None) -> RunOutcome:
        run.directory.mkdir(parents=True, exist_ok=True)
        with open(run.directory / CALLS_FILE, "a", encoding="utf-8") as calls:
            calls.write(f"{os.getpid()}\n")
        if run.name in self.fails:
            raise RuntimeError(f"{run.name}: the quick run failed on purpose")
        result = {"run": run.name, "key": run.key, "loss": (sum(map(ord, run.key)) % 97) / 10}
        (run.directory / "result.json").write_text(json.dumps(result))
        return RunOutcome(run, "done")


def _runs(run_dir: Path) -> tuple[TrainingRun, ...]:
    return tuple(
        TrainingRun(arm, seed, run_dir / "arms" / arm / f"seed-{seed}", f"key-{arm}-{seed}")
        for seed in (0, 1)
        for arm in ("uniform", "cosine")
    )


def check_launcher(
    cls: type[Any], params: dict[str, Any] | None = None, directory: Path | None = None
) -> None:
    """Check a ``launcher`` plugin class against its contract (docs/plugins.md) on four quick
    runs (two arms x two seeds, a picklable trainer that writes each run's result in its
    directory), under ``directory`` (default: a temporary one): it returns a list of
    :class:`~geospec.kinds.RunOutcome`, exactly one per run; no run is trained twice; every run
    it reports ``done`` was trained and holds what the ``local`` launcher's run holds (a run
    gives the same result wherever it is trained); and a run that fails reaches the caller,
    raised or as a ``failed`` outcome. A launcher that submits to a scheduler may answer
    ``submitted``. Raises :class:`~geospec.testing.ContractError` naming the broken rule."""
    plugin = plugin_instance(cls, Launcher, params)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        base = Path(scratch)
        local = _runs(base / "local")
        expected = {run.name: QuickTrainer()(run) and _result(run) for run in local}
        runs = _runs(base / "launched")
        said: list[str] = []
        outcomes = plugin.launch(Launch(runs, QuickTrainer(), base / "launched", said.append))
        rule(
            plugin,
            not isinstance(outcomes, list) or not all(isinstance(o, RunOutcome) for o in outcomes),
            f"launch must return a list of RunOutcome, got {outcomes!r}",
        )
        named = sorted(o.run.name for o in outcomes)
        rule(
            plugin,
            named != sorted(run.name for run in runs),
            f"launch must return exactly one outcome per run, got {named}",
        )
        for outcome in outcomes:
            run = outcome.run
            calls = _calls(run)
            rule(plugin, calls > 1, f"{run.name} was trained {calls} times; a run trains once")
            rule(
                plugin,
                outcome.state == "done" and (calls != 1 or _result(run) != expected[run.name]),
                f"{run.name} is reported done but its directory does not hold what the local "
                "launcher's run holds (the trainer must be called once per run, with that run)",
            )
            rule(
                plugin,
                outcome.state not in ("done", "submitted"),
                f"{run.name} ended {outcome.state!r} ({outcome.detail}) on a run that succeeds",
            )
        _check_failure(plugin, base / "failing")


def _check_failure(plugin: Launcher, run_dir: Path) -> None:
    runs = _runs(run_dir)
    failing = runs[1].name
    try:
        outcomes = plugin.launch(Launch(runs, QuickTrainer((failing,)), run_dir, lambda _: None))
    except ContractError:
        raise
    except Exception:
        return
    states = {o.run.name: o.state for o in outcomes}
    rule(
        plugin,
        _calls(runs[1]) > 0 and states.get(failing) != "failed",
        f"a failed run must reach the caller, raised or as a 'failed' outcome: {failing} "
        f"failed and was reported {states.get(failing)!r}",
    )


def _calls(run: TrainingRun) -> int:
    path = run.directory / CALLS_FILE
    return len(path.read_text().splitlines()) if path.exists() else 0


def _result(run: TrainingRun) -> Any:
    path = run.directory / "result.json"
    return json.loads(path.read_text()) if path.exists() else None


#: What :func:`check_tracker` logs: ``metrics.jsonl`` rows of a short run (training rows every
#: step, a validation row every second step), as a tracker receives them.
ROWS: tuple[tuple[int, dict[str, float]], ...] = tuple(
    (
        step,
        {"loss": 6.0 - 0.25 * step, "lr": 1e-3 * step, "tokens": 256.0 * step,
         "tokens_per_s": 1000.0 + step}
        | ({"val_loss": 6.1 - 0.2 * step} if step % 2 == 0 else {}),
    )
    for step in range(1, 7)
)  # fmt: skip
RESULT = {"final_val_loss": 4.9, "steps": 6, "tokens": 1536, "tokens_per_second": 1003.0}

#: Reads back what a tracker recorded for a run: metric name -> [(step, value)] in step order.
ReadBack = Callable[[TrackedRun], Mapping[str, list[tuple[int, float]]]]


def check_tracker(
    cls: type[Any],
    params: dict[str, Any] | None = None,
    read_back: ReadBack | None = None,
    directory: Path | None = None,
) -> None:
    """Check a ``tracker`` plugin class against its contract (docs/plugins.md) on a short run
    that stops after step 3 (``end(None)``) and resumes in a fresh instance (``start`` with
    ``step`` 3): no method raises on this documented sequence and none changes the metrics it
    is given; with ``read_back`` (what the tracker's own library reads back for the run) the
    round trip holds: every logged value under its name and step, each step once. Files go
    under ``directory`` (default: a temporary one). Raises
    :class:`~geospec.testing.ContractError` naming the broken rule."""
    plugin_instance(cls, Tracker, params)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        base = Path(scratch)
        run = TrackedRun(
            name="uniform/seed-0",
            group="contract-check",
            id="contract-check-0",
            directory=base / "arms" / "uniform" / "seed-0",
            run_dir=base,
            config={"arm": "uniform", "seed": 0, "widths": [64, 64], "run_key": "k"},
        )
        run.directory.mkdir(parents=True, exist_ok=True)
        _session(cls, params, run, ROWS[:3], None)
        resumed = TrackedRun(**{**run.__dict__, "step": 3})
        _session(cls, params, resumed, ROWS[3:], RESULT)
        if read_back is None:
            return
        recorded = {name: list(pairs) for name, pairs in read_back(run).items()}
        expected: dict[str, list[tuple[int, float]]] = {}
        for step, metrics in ROWS:
            for name, value in metrics.items():
                expected.setdefault(name, []).append((step, value))
        for name, pairs in expected.items():
            got = recorded.get(name, [])
            same = [s for s, _ in got] == [s for s, _ in pairs] and all(
                math.isclose(a, b, rel_tol=1e-6) for (_, a), (_, b) in zip(got, pairs, strict=True)
            )
            if not same:
                raise ContractError(
                    f"{cls.kind_name()}: every logged value must be recorded under its name and "
                    f"step, once (round trip): {name} logged {pairs}, read back {got}"
                )


def _session(
    cls: type[Any],
    params: dict[str, Any] | None,
    run: TrackedRun,
    rows: tuple[tuple[int, dict[str, float]], ...],
    result: Mapping[str, Any] | None,
) -> None:
    tracker = plugin_instance(cls, Tracker, params)  # a fresh instance per training session
    given = [(step, dict(metrics)) for step, metrics in rows]
    calls: list[tuple[str, Callable[[], None]]] = [("start", lambda: tracker.start(run))]
    for step, metrics in given:
        calls.append(("log", functools.partial(tracker.log, step, metrics)))
    calls.append(("end", lambda: tracker.end(None if result is None else dict(result))))
    for method, call in calls:
        try:
            call()
        except Exception as error:
            raise ContractError(
                f"{cls.kind_name()}: {method} must not raise on the documented call sequence (a "
                f"tracker that raises is turned off for the run): {type(error).__name__}: {error}"
            ) from error
    rule(tracker, given != list(rows), "log must not change the metrics it is given")
