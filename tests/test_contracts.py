"""The plugin contract kit (geospec.testing's check_* functions): every builtin plugin keeps its
kind's contract, and a plugin that breaks one rule fails with a message naming that rule
(docs/plugins.md states the rules)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest

from geospec import testing
from geospec.errors import UsageError
from geospec.kinds import (
    KINDS,
    Geometry,
    Launch,
    Launcher,
    ModelDims,
    RunOutcome,
    Schedule,
    ScoreAllocation,
    Smoother,
    Solver,
    Statistic,
    TrackedRun,
    Tracker,
    WidthProblem,
    reads_scores,
    round_to_budget,
)
from geospec.plugin import PluginParams
from geospec.registry.loading import get_registries
from geospec.testing import ContractError

#: The check of every kind, by kind name.
CHECKS: dict[str, Callable[..., None]] = {
    "geometry": testing.check_geometry,
    "statistic": testing.check_statistic,
    "smoother": testing.check_smoother,
    "solver": testing.check_solver,
    "schedule": testing.check_schedule,
    "launcher": testing.check_launcher,
    "tracker": testing.check_tracker,
    "importance": testing.check_importance,
}

#: Builtins that cannot be checked with their defaults: the params (and model) they are given.
PARAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("schedule", "geometric"): {"profile": "shift/raw"},
    ("schedule", "anti"): {"profile": "shift/raw"},
    ("schedule", "permuted"): {"profile": "shift/raw"},
    ("schedule", "fitted"): {"of": "source"},
    ("schedule", "sorted"): {"of": "source"},
    ("schedule", "manual"): {"widths": [72, 56, 64, 64, 64, 64]},
    # a training model has no pretrained width: the protected layers' width is given
    ("schedule", "protect"): {
        "first": 1,
        "last": 1,
        "width": 96,
        "around": {"kind": "geometric", "profile": "shift/raw"},
    },
}
#: A pruned model's: the pretrained width caps every layer (what flap and owl allocate under).
PRUNED = ModelDims(n_layers=6, d_model=32, ffn_width=64, multiple_of=8, max_width=96)


def builtins(kind: str) -> list[str]:
    registry = get_registries()[kind]
    return [name for name, entry in registry.entries.items() if entry.provider.name == "geospec"]


def test_every_kind_has_a_contract_check() -> None:
    assert set(CHECKS) == set(KINDS)
    assert all(name in testing.__all__ for name in (f.__name__ for f in CHECKS.values()))


@pytest.mark.torch
@pytest.mark.parametrize("name", builtins("geometry"))
def test_the_builtin_geometries_keep_their_contract(name: str) -> None:
    testing.check_geometry(get_registries()["geometry"].get(name).cls)


@pytest.mark.torch
@pytest.mark.parametrize("name", builtins("statistic"))
def test_the_builtin_statistics_keep_their_contract_in_every_builtin_geometry(name: str) -> None:
    geometries = tuple(builtins("geometry"))
    testing.check_statistic(get_registries()["statistic"].get(name).cls, geometries=geometries)


@pytest.mark.parametrize(
    ("kind", "name"),
    [(kind, name) for kind in ("smoother", "solver", "schedule") for name in builtins(kind)],
)
def test_the_builtin_smoothers_solvers_and_schedules_keep_their_contract(
    kind: str, name: str
) -> None:
    cls = get_registries()[kind].get(name).cls
    params = PARAMS.get((kind, name))
    if kind == "schedule" and reads_scores(cls):
        testing.check_schedule(cls, params, dims=PRUNED)
    else:
        CHECKS[kind](cls, params)


#: Inside protect (first = 1 of PRUNED's 6 layers) the other five share 384 - 96 = 288.
AROUND = {"manual": {"widths": [64, 56, 56, 56, 56]}}


def _around_params(name: str) -> dict[str, Any]:
    return AROUND.get(name, PARAMS.get(("schedule", name), {}))


def _runs_inside_protect(name: str) -> bool:
    """Reads neither other arms' widths nor neuron scores (protect refuses those)."""
    cls = get_registries()["schedule"].get(name).cls
    inner = cls(cls.Params.model_validate(_around_params(name)))
    return not reads_scores(cls) and not inner.required_arms()


@pytest.mark.parametrize("name", [n for n in builtins("schedule") if _runs_inside_protect(n)])
def test_every_builtin_schedule_of_widths_keeps_the_contract_inside_protect(name: str) -> None:
    """On a part of a model whose share, 57.6 a layer, is no whole width (ModelDims.part)."""
    params = _around_params(name)
    protect = get_registries()["schedule"].get("protect").cls
    testing.check_schedule(protect, {"around": {"kind": name, **params}}, dims=PRUNED)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["local", "pool"])  # slurm needs a cluster: test_launchers.py
def test_the_builtin_launchers_keep_their_contract(name: str, tmp_path: Path) -> None:
    testing.check_launcher(get_registries()["launcher"].get(name).cls, directory=tmp_path)


@pytest.mark.trackers
def test_tensorboard_keeps_the_tracker_contract_and_its_event_files_round_trip(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def read_back(run: TrackedRun) -> dict[str, list[tuple[int, float]]]:
        path = run.run_dir / "tensorboard" / run.group / run.name
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        return {
            tag: [(s.step, s.value) for s in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]
        }

    cls = get_registries()["tracker"].get("tensorboard").cls
    testing.check_tracker(cls, read_back=read_back, directory=tmp_path)


@pytest.mark.trackers
def test_mlflow_keeps_the_tracker_contract_and_its_store_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores behind this
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()

    def read_back(run: TrackedRun) -> dict[str, list[tuple[int, float]]]:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(run.group)
        [found] = client.search_runs([experiment.experiment_id])
        return {
            name: [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, name)]
            for name in found.data.metrics
        }

    cls = get_registries()["tracker"].get("mlflow").cls
    testing.check_tracker(cls, {"tracking_uri": uri}, read_back=read_back, directory=tmp_path)


@pytest.mark.trackers
def test_wandb_offline_keeps_the_tracker_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cls = get_registries()["tracker"].get("wandb").cls
    testing.check_tracker(cls, {"mode": "offline", "dir": str(tmp_path)}, directory=tmp_path)


# -- plugins that break one rule each ---------------------------------------------------------


def fails(check: Callable[..., None], cls: type[Any], rule: str, **kwargs: Any) -> None:
    """``check`` refuses ``cls`` with a message holding ``rule``; the class it breaks (the
    flawless base, ``cls.__base__``) passes."""
    with pytest.raises(ContractError, match=re.escape(rule)):
        check(cls, **kwargs)
    check(cls.__base__, **kwargs)


def flawed(base: type[Any], flaw: str, **attributes: Any) -> type[Any]:
    return type(f"{base.__name__}_{flaw}", (base,), {"flaw": flaw, **attributes})


class Euclid(Geometry):
    """Euclidean distance (a correct geometry, unless ``flaw`` names what it breaks)."""

    class Params(PluginParams):
        kind: Literal["euclid"] = "euclid"

    scale_sensitive = True
    flaw: ClassVar[str] = ""

    def prepare(self, cloud: Any) -> Any:
        if self.flaw == "mutates":
            cloud[0, 0] += 1.0
        if self.flaw == "drops_a_token":
            return cloud[1:].double()
        return cloud.float() if self.flaw == "float32" else cloud.double()

    def pairwise(self, points: Any) -> Any:
        import torch

        if self.flaw == "float64_only" and points.dtype != torch.float64:
            raise TypeError("expected float64 points")
        distances = torch.cdist(points, points)
        distances.fill_diagonal_(0.0)
        if self.flaw == "square":
            return distances[:, :-1]
        if self.flaw == "nan":
            distances[0, 1] = float("nan")
        if self.flaw == "negative":
            return -distances
        if self.flaw == "asymmetric":
            return distances + 0.1 * torch.ones_like(distances).triu(1)
        if self.flaw == "diagonal":
            return distances + 1.0
        return distances

    def paired(self, a: Any, b: Any) -> Any:
        if self.flaw == "paired_l1":
            return (a - b).abs().sum(dim=1)
        return (a - b).norm(dim=1)


@pytest.mark.torch
@pytest.mark.parametrize(
    ("flaw", "rule"),
    [
        ("mutates", "prepare must not change the cloud it is given"),
        ("drops_a_token", "prepare must give one row per token (40 x k)"),
        ("float32", "prepare must give float64 on the CPU"),
        ("square", "pairwise must give a tensor of shape (40, 40)"),
        ("nan", "pairwise distances must be finite"),
        ("negative", "pairwise distances must be non-negative"),
        ("asymmetric", "pairwise distances must be symmetric"),
        ("diagonal", "pairwise distances must have a zero diagonal"),
        ("paired_l1", "paired(a, b)[i] must equal pairwise of both clouds"),
    ],
)
def test_a_broken_geometry_fails_the_rule_it_breaks(flaw: str, rule: str) -> None:
    fails(testing.check_geometry, flawed(Euclid, flaw), rule)


@pytest.mark.torch
def test_a_geometry_that_misdeclares_its_scale_sensitivity_fails() -> None:
    rule = "scale_sensitive must say whether rescaling both clouds changes the distances"
    fails(testing.check_geometry, flawed(Euclid, "", scale_sensitive=False), rule)


@pytest.mark.torch
def test_a_geometry_on_any_device_must_compute_on_float32_points() -> None:
    rule = "pairwise_on_device is True, but pairwise fails on float32 points"
    fails(testing.check_geometry, flawed(Euclid, "float64_only", pairwise_on_device=True), rule)
    # without the claim, the same geometry is sound: it gets float64 CPU points on any run
    testing.check_geometry(flawed(Euclid, "float64_only"))
    testing.check_geometry(flawed(Euclid, "", pairwise_on_device=True))


class MeanShift(Statistic):
    """The mean distance a token moved (a correct statistic, unless ``flaw`` names a break)."""

    class Params(PluginParams):
        kind: Literal["mean_shift"] = "mean_shift"

    flaw: ClassVar[str] = ""
    calls: ClassVar[int] = 0

    def __call__(self, geometry: Geometry, x: Any, y: Any) -> float:
        import torch

        moved = geometry.paired(geometry.prepare(x), geometry.prepare(y))
        type(self).calls += 1
        if self.flaw == "tensor":
            return moved.mean()  # type: ignore[no-any-return]
        if self.flaw == "nan":
            return float("nan")
        if self.flaw == "negative":
            return -float(moved.mean())
        if self.flaw == "mutates":
            x.mul_(1.5)
        if self.flaw == "unstable":
            return float(moved.mean()) + type(self).calls
        if self.flaw == "offset":
            return float(moved.mean()) + 1.0
        if self.flaw == "positional":
            return float((moved * torch.arange(len(moved))).mean())
        return float(moved.mean())


@pytest.mark.torch
@pytest.mark.parametrize(
    ("flaw", "rule"),
    [
        ("tensor", "the work must be a Python float, got Tensor"),
        ("nan", "the work must be finite"),
        ("negative", "the work must be non-negative"),
        ("mutates", "the statistic must not change the clouds it is given"),
        ("unstable", "the same clouds must give the same work"),
        ("offset", "the work between identical clouds must be 0"),
        ("positional", "permuting the tokens of both clouds together must not change the work"),
    ],
)
def test_a_broken_statistic_fails_the_rule_it_breaks(flaw: str, rule: str) -> None:
    fails(testing.check_statistic, flawed(MeanShift, flaw), rule)


class Neighbours(Smoother):
    """Each layer averaged with its neighbours (a correct smoother, unless ``flaw`` says)."""

    class Params(PluginParams):
        kind: Literal["neighbours"] = "neighbours"

    flaw: ClassVar[str] = ""
    calls: ClassVar[int] = 0

    def __call__(self, profile: Sequence[float]) -> list[float]:
        type(self).calls += 1
        n = len(profile)
        window = [profile[max(0, i - 1) : i + 2] for i in range(n)]
        smoothed = [sum(w) / len(w) for w in window]
        if self.flaw == "tuple":
            return tuple(smoothed)  # type: ignore[return-value]
        if self.flaw == "shorter":
            return smoothed[:-1]
        if self.flaw == "nan":
            return [float("nan")] * n
        if self.flaw == "negative":
            return [v - 2.0 for v in smoothed]
        if self.flaw == "mutates" and isinstance(profile, list):
            profile.reverse()
        if self.flaw == "unstable":
            return [v * (1 + 1e-6 * type(self).calls) for v in smoothed]
        if self.flaw == "normalised":
            return [v / max(smoothed) for v in smoothed]
        return smoothed


@pytest.mark.parametrize(
    ("flaw", "rule"),
    [
        ("tuple", "a smoothed profile must be a list of the profile's length 1"),
        ("shorter", "a smoothed profile must be a list of the profile's length 1"),
        ("nan", "a smoothed profile must hold finite floats"),
        ("negative", "a non-negative profile must stay non-negative"),
        ("mutates", "the smoother must not change the profile it is given"),
        ("unstable", "the same profile must smooth the same"),
        ("normalised", "a constant profile must stay constant"),
    ],
)
def test_a_broken_smoother_fails_the_rule_it_breaks(flaw: str, rule: str) -> None:
    fails(testing.check_smoother, flawed(Neighbours, flaw), rule)


class Even(Solver):
    """The uniform width for every layer (a correct solver, unless ``flaw`` says)."""

    class Params(PluginParams):
        kind: Literal["even"] = "even"

    flaw: ClassVar[str] = ""
    calls: ClassVar[int] = 0

    def solve(self, problem: WidthProblem) -> list[int]:
        type(self).calls += 1
        m = problem.multiple
        widths = [problem.budget // problem.n_layers] * problem.n_layers
        if self.flaw == "floats":
            return [float(w) for w in widths]  # type: ignore[misc]
        if self.flaw == "short":
            return widths[:-1]
        if self.flaw == "over":
            widths[0] += m
        if self.flaw == "not_multiple":
            widths[0], widths[1] = widths[0] + 1, widths[1] - 1
        if self.flaw == "above_upper" and widths[0] + 5 * m > problem.upper:
            widths[0], widths[1] = widths[0] + 5 * m, widths[1] - 5 * m
        if self.flaw == "unstable" and type(self).calls % 2:
            widths[0], widths[1] = widths[0] + m, widths[1] - m
        if self.flaw == "tilted":
            widths[0], widths[-1] = widths[0] + m, widths[-1] - m
        return widths

    def bounds(self, problem: WidthProblem) -> tuple[int, int] | None:
        return (0, problem.upper) if self.flaw == "wide_bounds" else None


@pytest.mark.parametrize(
    ("flaw", "rule"),
    [
        ("floats", "every width must be an int"),
        ("short", "widths must be a list of one width per layer (6)"),
        ("over", "widths must sum exactly to the budget 384"),
        ("not_multiple", "every width must be a positive multiple of 8"),
        ("above_upper", "every width must lie within [16, 160]"),
        ("wide_bounds", "bounds must lie within the hard limits [8, 384]"),
        ("unstable", "the same problem must give the same widths"),
        ("tilted", "equal work must give every layer the uniform width 48"),
    ],
)
def test_a_broken_solver_fails_the_rule_it_breaks(flaw: str, rule: str) -> None:
    fails(testing.check_solver, flawed(Even, flaw), rule)


class FromProfile(Schedule):
    """Uniform widths, reading the profile ``shift/raw`` and the arm ``source`` (a correct
    schedule, unless ``flaw`` says)."""

    class Params(PluginParams):
        kind: Literal["from_profile"] = "from_profile"

    flaw: ClassVar[str] = ""
    calls: ClassVar[int] = 0

    def required_profiles(self) -> list[str]:
        return ["shift/raw"]

    def required_arms(self) -> list[str]:
        return ["source"]

    def check(self, dims: ModelDims) -> list[str]:
        return ["this schedule refuses every model"] if self.flaw == "refuses" else []

    def widths_from(
        self,
        dims: ModelDims,
        profiles: Mapping[str, Sequence[float]],
        arms: Mapping[str, Sequence[int]],
    ) -> list[int]:
        type(self).calls += 1
        assert len(profiles["shift/raw"]) == len(arms["source"]) == dims.n_layers
        m = dims.multiple_of
        widths = [dims.ffn_width] * dims.n_layers
        if self.flaw == "over":
            widths[0] += m
        if self.flaw == "above_cap":
            widths[0], widths[1] = widths[0] + 2 * m, widths[1] - 2 * m
        if self.flaw == "outside_bounds":
            widths[0], widths[1] = widths[0] + m, widths[1] - m
        if self.flaw == "unstable" and type(self).calls % 2:
            widths[0], widths[1] = widths[0] + m, widths[1] - m
        if self.flaw == "mutates":
            profile = profiles["shift/raw"]
            assert isinstance(profile, list)
            profile.reverse()
        return widths

    def bounds(self, dims: ModelDims) -> tuple[int, int] | None:
        return (dims.ffn_width, dims.ffn_width) if self.flaw == "outside_bounds" else None


@pytest.mark.parametrize(
    ("flaw", "rule"),
    [
        ("refuses", "check(dims) reports problems for the model checked"),
        ("over", "widths must sum exactly to the budget 384"),
        ("above_cap", "no width may exceed 72"),
        ("outside_bounds", "every width must lie within the schedule's bounds [64, 64]"),
        ("unstable", "the same inputs must give the same widths"),
        ("mutates", "the schedule must not change the profiles or arm widths it is given"),
    ],
)
def test_a_broken_schedule_fails_the_rule_it_breaks(flaw: str, rule: str) -> None:
    dims = ModelDims(n_layers=6, d_model=32, ffn_width=64, multiple_of=8, max_width=72)
    fails(testing.check_schedule, flawed(FromProfile, flaw), rule, dims=dims)


class Largest(ScoreAllocation):
    """Every layer a share of the budget by the sum of its scores, rounded to multiples (a correct
    score allocation, unless ``flaw`` says)."""

    class Params(PluginParams):
        kind: Literal["largest"] = "largest"

    flaw: ClassVar[str] = ""

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        totals = [sum(layer) for layer in scores]
        shares = [dims.budget * t / sum(totals) for t in totals]
        return round_to_budget(shares, dims.budget, dims.multiple_of, upper=dims.max_width)

    def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
        if self.flaw == "answers_widths":
            return [dims.ffn_width] * dims.n_layers
        if self.flaw == "crashes_in_widths":
            raise NotImplementedError
        return super().widths(dims, profiles)


@pytest.mark.parametrize("flaw", ["answers_widths", "crashes_in_widths"])
def test_a_score_allocation_that_does_not_refuse_widths_fails(flaw: str) -> None:
    fails(
        testing.check_schedule,
        flawed(Largest, flaw),
        "a score allocation must refuse widths(dims, profiles)",
        dims=PRUNED,
    )


def test_a_schedule_setting_the_old_flag_warns_and_keeps_working() -> None:
    with pytest.warns(DeprecationWarning, match="subclass geospec.kinds.ScoreAllocation"):

        class OldStyle(Schedule):
            reads_neuron_scores = True

            class Params(PluginParams):
                kind: Literal["old_style"] = "old_style"

            def widths(self, dims: ModelDims, profiles: Mapping[str, Sequence[float]]) -> list[int]:
                raise UsageError("old_style needs neuron scores")

            def widths_from_scores(
                self, dims: ModelDims, scores: Sequence[Sequence[float]]
            ) -> list[int]:
                return Largest().widths_from_scores(dims, scores)

    assert reads_scores(OldStyle) and reads_scores(OldStyle())
    assert reads_scores(Largest) and not reads_scores(Schedule)
    testing.check_schedule(OldStyle, dims=PRUNED)


class InOrder(Launcher):
    """Every run in this process, in order (a correct launcher, unless ``flaw`` says)."""

    class Params(PluginParams):
        kind: Literal["in_order"] = "in_order"

    flaw: ClassVar[str] = ""

    def launch(self, launch: Launch) -> list[RunOutcome]:
        outcomes = []
        for run in launch.runs:
            if self.flaw == "lies":
                outcomes.append(RunOutcome(run, "done"))
                continue
            try:
                outcomes.append(launch.trainer(run))
            except RuntimeError:
                if self.flaw != "swallows":
                    raise
                outcomes.append(RunOutcome(run, "done"))
            if self.flaw == "twice":
                launch.trainer(run)
        if self.flaw == "drops":
            return outcomes[:-1]
        if self.flaw == "tuple":
            return tuple(outcomes)  # type: ignore[return-value]
        if self.flaw == "fails":
            return [RunOutcome(o.run, "failed", "no reason") for o in outcomes]
        return outcomes


@pytest.mark.parametrize(
    ("flaw", "rule"),
    [
        ("tuple", "launch must return a list of RunOutcome"),
        ("drops", "launch must return exactly one outcome per run"),
        ("twice", "uniform/seed-0 was trained 2 times; a run trains once"),
        ("lies", "uniform/seed-0 is reported done but its directory does not hold"),
        ("fails", "uniform/seed-0 ended 'failed' (no reason) on a run that succeeds"),
        ("swallows", "a failed run must reach the caller, raised or as a 'failed' outcome"),
    ],
)
def test_a_broken_launcher_fails_the_rule_it_breaks(flaw: str, rule: str, tmp_path: Path) -> None:
    fails(testing.check_launcher, flawed(InOrder, flaw), rule, directory=tmp_path)


class JsonLines(Tracker):
    """Appends every row to ``tracked.jsonl`` in the training directory (a correct tracker,
    unless ``flaw`` says)."""

    class Params(PluginParams):
        kind: Literal["json_lines"] = "json_lines"

    flaw: ClassVar[str] = ""

    def start(self, run: TrackedRun) -> None:
        if self.flaw == "no_resume" and run.step > 0:
            raise RuntimeError("cannot resume")
        mode = "w" if self.flaw == "truncates" else "a"
        self.file = open(run.directory / "tracked.jsonl", mode, encoding="utf-8")  # noqa: SIM115

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.flaw == "mutates" and isinstance(metrics, dict):
            metrics.pop("lr")
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")

    def end(self, result: Mapping[str, Any] | None) -> None:
        self.file.close()


def read_json_lines(run: TrackedRun) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for line in (run.directory / "tracked.jsonl").read_text().splitlines():
        row = json.loads(line)
        step = row.pop("step")
        for name, value in row.items():
            series.setdefault(name, []).append((step, value))
    return series


@pytest.mark.parametrize(
    ("flaw", "rule"),
    [
        ("no_resume", "start must not raise on the documented call sequence"),
        ("mutates", "log must not change the metrics it is given"),
        ("truncates", "every logged value must be recorded under its name and step, once"),
    ],
)
def test_a_broken_tracker_fails_the_rule_it_breaks(flaw: str, rule: str, tmp_path: Path) -> None:
    fails(testing.check_tracker, flawed(JsonLines, flaw), rule, read_back=read_json_lines)


def test_a_class_of_another_kind_is_refused_by_name() -> None:
    with pytest.raises(ContractError, match=r"is not a geospec\.kinds\.Solver subclass"):
        testing.check_solver(Neighbours)
