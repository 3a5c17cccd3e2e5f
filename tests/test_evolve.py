"""The evolutionary search allocation (``evolve``) against independent truth on a tiny Llama:
its KL fitness equals a direct computation on the truly cut model; with few levels it finds
the best of every allocation, enumerated; the budget is exact after every generation; the same
seed gives the same widths, and a killed search resumes to the identical result. Through
``geospec prune``: it reads only the calibration text, and bad input is one line, exit 2."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hf_models
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from test_prune import invoke, prune_spec

from geospec.cli import cli
from geospec.errors import UsageError
from geospec.kinds import ModelDims, Search
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.cut import pruned
from geospec.prune.evolve import Evolution
from geospec.prune.losses import eval_loss
from geospec.prune.score import calibration_windows, neuron_scores
from geospec.prune.search import CalibrationFitness, calibration_batches
from geospec.prune.unit_search import SealedSearchState
from geospec.report.plots import prune_plot

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

WIDTH = 48  # every layer's pretrained width; multiples of 8
WINDOWS, SEQ = 6, 16


@pytest.fixture(scope="module")
def setting() -> tuple[torch.nn.Module, list, list[list[float]], list[list[int]], list]:
    model = hf_models.llama(intermediate_size=WIDTH)
    with torch.no_grad():  # FFNs that matter: at its initial scale a cut moves the KL by 1e-6
        for layer in model.model.layers:
            for linear in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
                linear.weight.mul_(6)
    sites = find_ffn_sites(
        model, hf_models.WIDTH, lambda: logits_of(model, torch.zeros(1, 4, dtype=torch.long))
    )
    tokens = np.random.default_rng(0).integers(0, hf_models.VOCAB, 600)
    starts = calibration_windows(tokens, SEQ, WINDOWS, seed=0)
    importance = create_plugin("importance", {"kind": "activation"})
    scores, orders = neuron_scores(model, sites, importance, tokens, starts, SEQ, 4)
    batches = calibration_batches(tokens, starts, SEQ, 4, torch.device("cpu"))
    return model, sites, scores, orders, batches


def fitness_of(setting: tuple, kind: str = "kl", cut: str = "true") -> CalibrationFitness:
    model, sites, _, orders, batches = setting
    return CalibrationFitness(model, sites, orders, batches, kind, batch_size=4, cut=cut)


def direct_kl(setting: tuple, widths: list[int], rows: list[int]) -> float:
    """The mean per-token KL(unpruned || cut) on windows ``rows``, the model's FFNs truly cut
    (modules rebuilt), by torch.nn.functional.kl_div on the full logits."""
    model, sites, _, orders, batches = setting
    inputs = torch.cat([x for x, _ in batches])[rows]
    with torch.no_grad():
        teacher = logits_of(model, inputs).flatten(0, 1).log_softmax(-1)
        with pruned(sites, orders, widths):
            student = logits_of(model, inputs).flatten(0, 1).log_softmax(-1)
    return float(F.kl_div(student, teacher, reduction="batchmean", log_target=True))


@pytest.mark.parametrize("cut", ["true", "zero"])
def test_the_kl_fitness_is_the_kl_of_the_cut_model(setting: tuple, cut: str) -> None:
    """Candidates run from their first layer that differs from the base score what the truly
    cut model scores by full passes, whether they run at their true widths or with zeroed
    activations; without a base, the same; the loss fitness is the cut model's calibration
    loss; afterwards the model is the one it was (the same parameter objects)."""
    model, sites, _, orders, batches = setting
    before = [(name, id(param)) for name, param in model.named_parameters()]
    fitness = fitness_of(setting, cut=cut)
    assert fitness.windows == WINDOWS and fitness.window_tokens == SEQ - 1
    base = [40, 32, 24]
    candidates = [[40, 32, 24], [32, 40, 24], [40, 24, 32], [24, 40, 32], [48, 16, 32]]
    rows = [5, 1, 3]
    got = fitness(candidates, rows, base=base)
    assert fitness.fallback is None  # the tiny Llama runs from a layer on
    for widths, value in zip(candidates, got, strict=True):
        assert value == pytest.approx(direct_kl(setting, widths, sorted(rows)), rel=1e-5)
    assert fitness(candidates, rows) == pytest.approx(got, rel=1e-9)
    losses = fitness_of(setting, "loss", cut)(candidates, list(range(WINDOWS)), base=base)
    for widths, value in zip(candidates, losses, strict=True):
        with torch.no_grad(), pruned(sites, orders, widths):
            assert value == pytest.approx(eval_loss(model, batches), rel=1e-6)
    assert [(name, id(param)) for name, param in model.named_parameters()] == before


class Killed(Exception):
    """Raised by :class:`KilledAfter` in place of the process being killed."""


class KilledAfter(SealedSearchState):
    """The real sealed state, and the process dies right after generation ``after`` is saved."""

    def __init__(self, after: int, *args: Any) -> None:
        super().__init__(*args)
        self.after = after

    def save(self, state: dict[str, Any]) -> None:
        super().save(state)
        if len(state["trajectory"]) == self.after:
            raise Killed


DIMS = ModelDims(3, hf_models.WIDTH, 32, 8, "swiglu", max_width=WIDTH)  # budget 96


def search(
    setting: tuple,
    path: Path,
    said: list[str] | None = None,
    after: int | None = None,
    **params: Any,
) -> list[int]:
    """The search ``params`` on the tiny Llama at budget 96, its state in ``path``."""
    _, _, scores, _, _ = setting
    table = {
        "kind": "evolve",
        "stages": [{"tokens": 30, "survivors": 2}, {"tokens": 90, "survivors": 1}],
    }
    schedule = create_plugin("schedule", table | params)
    args = (
        path,
        "key",
        (said if said is not None else []).append,
        "evolve",
        schedule.params.generations,
    )
    state = SealedSearchState(*args) if after is None else KilledAfter(after, *args)
    found = schedule.widths_from_search(
        DIMS, scores, {}, Search(lambda kind: fitness_of(setting, kind), state)
    )
    return [int(w) for w in found]


def trajectory(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["state"]["trajectory"]


def test_the_search_finds_the_best_allocation_of_a_small_space(
    setting: tuple, tmp_path: Path
) -> None:
    """Widths 16..48 in steps of 8 summing to 96 over 3 layers: 19 allocations, each scored by
    the direct KL on every calibration window; the search, every stage on every window, ends
    at the best of them, and every generation's widths keep the budget within the bounds."""
    levels = range(16, WIDTH + 1, 8)
    space = [list(w) for w in itertools.product(levels, repeat=3) if sum(w) == 96]
    assert len(space) == 19
    every = list(range(WINDOWS))
    truth = {tuple(w): direct_kl(setting, w, every) for w in space}
    best = min(truth, key=truth.__getitem__)
    assert sorted(truth.values())[1] - truth[best] > 1e-3 * truth[best]  # a clear best
    all_tokens = WINDOWS * (SEQ - 1)
    path = tmp_path / "search.json"
    found = search(
        setting, path, min_width=16, generations=8, offspring=6,
        stages=[{"tokens": all_tokens, "survivors": 1}],
    )  # fmt: skip
    assert tuple(found) == best
    steps = trajectory(path)
    assert len(steps) == 8
    for step in steps:
        assert sum(step["widths"]) == 96
        assert all(16 <= w <= WIDTH and w % 8 == 0 for w in step["widths"])
        assert step["fitness"] == pytest.approx(truth[tuple(step["widths"])], rel=1e-5)
    assert [s["fitness"] for s in steps] == sorted((s["fitness"] for s in steps), reverse=True)


def test_the_same_seed_gives_the_same_widths_and_a_killed_search_resumes(
    setting: tuple, tmp_path: Path
) -> None:
    """Two searches with one seed give the same widths and trajectory; a search killed after
    generation 3 and started again (a fresh fitness, the state read back) ends identical to
    the uninterrupted one, and says each generation it ran."""
    params: dict[str, Any] = {"generations": 6, "offspring": 4, "seed": 3}
    first = search(setting, tmp_path / "a.json", **params)
    assert search(setting, tmp_path / "b.json", **params) == first
    assert trajectory(tmp_path / "a.json") == trajectory(tmp_path / "b.json")
    with pytest.raises(Killed):
        search(setting, tmp_path / "c.json", after=3, **params)
    assert len(trajectory(tmp_path / "c.json")) == 3
    said: list[str] = []
    assert search(setting, tmp_path / "c.json", said, **params) == first
    assert trajectory(tmp_path / "c.json") == trajectory(tmp_path / "a.json")
    assert len(said) == 3 and said[0].startswith("prune: evolve: generation 4/6, fitness ")


def test_a_state_of_other_inputs_or_edited_is_not_resumed(tmp_path: Path) -> None:
    path = tmp_path / "search.json"
    SealedSearchState(path, "key", print, "evolve", 1).save({"parent": [1], "trajectory": []})
    assert SealedSearchState(path, "key", print, "evolve", 1).load() == {
        "parent": [1], "trajectory": [],
    }  # fmt: skip
    assert SealedSearchState(path, "other", print, "evolve", 1).load() is None
    data = json.loads(path.read_text())
    data["state"]["parent"] = [2]
    path.write_text(json.dumps(data))
    assert SealedSearchState(path, "key", print, "evolve", 1).load() is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"stages": [{"tokens": 98, "survivors": 1}]}, "stages[0].tokens"),  # 7 windows of 15
        ({"step": 3}, "step"),  # 24 neurons: none of 32, 32, 32 within 16..48 can move
        ({"min_width": 40}, "min_width"),
        ({"max_width": 56}, "max_width"),
    ],
)
def test_what_the_search_refuses_names_the_field(
    setting: tuple, tmp_path: Path, params: dict[str, Any], field: str
) -> None:
    table = {"min_width": 16, "max_width": 40} if "min_width" not in params else {}
    with pytest.raises(UsageError, match="^" + re.escape(f"{field}: ")):
        search(setting, tmp_path / "s.json", **(table | params))


def test_a_search_cannot_start_a_search() -> None:
    schedule = create_plugin("schedule", {"kind": "evolve", "start": {"kind": "evolve"}})
    assert schedule.check(DIMS)[0].startswith("start: 'evolve' is a search")
    geometric = {"kind": "geometric", "profile": "shift/spherical"}
    schedule = create_plugin("schedule", {"kind": "evolve", "start": geometric})
    assert schedule.check(DIMS)[0].startswith("start: 'geometric' reads profiles")


EVOLVE = {"generations": 3, "offspring": 4, "stages": [{"tokens": 30, "survivors": 1}]}


def test_an_evolve_arm_searches_through_the_prune_and_keeps_its_path(tmp_path: Path) -> None:
    """Through geospec prune, started from another arm: its widths keep the budget, its unit
    records the trajectory, and each generation is said."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "shift", "schedule": {"kind": "geometric", "profile": "shift/spherical"}},
        {"name": "evolve", "schedule": {"kind": "evolve", "start_arm": "shift"} | EVOLVE},
    ]
    spec = prune_spec(tmp_path, keep=0.5, calibration={"windows": 4, "seeds": [0]}, arms=arms)
    output = invoke("prune", str(spec))
    assert "generation 3/3" in output
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    widths = record["budgets"][0]["arms"]["evolve"]["widths"]["0"]
    assert sum(widths) == 96 and all(w % 8 == 0 and 8 <= w <= 64 for w in widths)
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "evolve" / "seed-0"
    steps = json.loads((unit / "result.json").read_text())["search"]["trajectory"]
    assert [s["generation"] for s in steps] == [1, 2, 3] and steps[-1]["widths"] == widths
    assert "The search 'evolve': its fitness on the calibration windows" in output
    assert prune_plot(tmp_path / "run", record)[-1] == "plots/search.png"
    assert (tmp_path / "run" / "plots" / "search.png").stat().st_size > 0
    path = record["budgets"][0]["arms"]["evolve"]["search"]["0"]
    assert path == {
        "fitness": [s["fitness"] for s in steps],
        "accepted": [s["accepted"] for s in steps],
        "stopped": {"by": "generations", "generation": 3},
    }
    assert "3 generations moved, stopped at its cap of 3 generations" in output


def test_a_search_with_patience_through_the_prune_says_why_it_stopped(tmp_path: Path) -> None:
    """With ``patience``, the unit's record, prune.json, the report and the progress lines say
    that patience stopped the search and at which generation; plots/search.png is drawn."""
    evolve = EVOLVE | {"generations": 40, "patience": 1}
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "evolve", "schedule": {"kind": "evolve"} | evolve},
    ]
    spec = prune_spec(tmp_path, keep=0.5, calibration={"windows": 4, "seeds": [0]}, arms=arms)
    output = invoke("prune", str(spec))
    unit = tmp_path / "run" / "prune" / "keep-0.5" / "evolve" / "seed-0"
    search = json.loads((unit / "result.json").read_text())["search"]
    stopped = search["stopped"]
    done = len(search["trajectory"])
    assert stopped == {"by": "patience", "generation": done, "best_generation": done - 1,
                       "patience": 1}  # fmt: skip
    assert done < 40
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    path = record["budgets"][0]["arms"]["evolve"]["search"]["0"]
    assert path["stopped"] == stopped
    assert path["tracked"] == [step["tracked"] for step in search["trajectory"]]
    said = (
        f"stopped at generation {done} by patience 1: no better parent on the tracked windows "
        f"since generation {done - 1}"
    )
    assert f"generation {done}/40, fitness" in output and said in output
    assert f"generation {done + 1}/40" not in output
    assert prune_plot(tmp_path / "run", record)[-1] == "plots/search.png"


@pytest.mark.parametrize(
    ("schedule", "said"),
    [
        ({"start_arm": "nowhere"}, "prune.arms[1].schedule.start_arm: no arm is named 'nowhere'"),
        ({"start_arm": "evolve"}, "prune.arms[1].schedule.start_arm: arm 'evolve' cannot be"),
        ({"start": {"kind": "evolve"}}, "prune.arms[1].schedule: at keep 0.5: start: 'evolve' is"),
        ({"generations": 0}, "prune.arms[1].schedule.generations"),
        ({"patience": 0}, "prune.arms[1].schedule.patience"),
        ({"fitness": "loss", "kl_top_k": 8}, "prune.arms[1].schedule: kl_top_k lumps"),
        ({"step": 5}, "prune.arms[1].schedule: at keep 0.5: step: no layer of [32, 32, 32] can"),
        ({"min_width": 40}, "prune.arms[1].schedule: at keep 0.5: min_width: 40 leaves no"),
        ({"max_width": 72}, "prune.arms[1].schedule: at keep 0.5: max_width: 72 exceeds the"),
    ],
)
def test_a_bad_evolve_arm_is_one_line_naming_the_field(
    tmp_path: Path, schedule: dict[str, Any], said: str
) -> None:
    """geospec validate refuses it before anything is loaded: one line, exit 2."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "evolve", "schedule": {"kind": "evolve"} | schedule},
    ]
    spec = prune_spec(tmp_path, keep=0.5, calibration={"windows": 4, "seeds": [0]}, arms=arms)
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and said in result.output


def test_stages_longer_than_the_calibration_text_stop_the_prune_in_one_line(
    tmp_path: Path,
) -> None:
    """4 calibration windows of 15 scored tokens hold 60: a stage of 68 (5 windows) is refused
    by name, exit 2, before any generation."""
    stages = [{"tokens": 68, "survivors": 1}]
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "evolve", "schedule": {"kind": "evolve"} | EVOLVE | {"stages": stages}},
    ]
    spec = prune_spec(tmp_path, keep=0.5, calibration={"windows": 4, "seeds": [0]}, arms=arms)
    result = CliRunner().invoke(cli, ["prune", str(spec)])
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("error")]
    assert len(error) == 1 and "prune arm 'evolve': stages[0].tokens: 68 tokens need 5" in error[0]
    assert ": generation " not in result.output  # no generation's line: none ran


def test_a_prune_of_other_arms_runs_no_search(tmp_path: Path) -> None:
    """``geospec prune --arms uniform`` computes uniform's units and leaves the search alone;
    the whole prune then searches and reuses them."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "evolve", "schedule": {"kind": "evolve"} | EVOLVE},
    ]
    spec = prune_spec(tmp_path, keep=0.5, calibration={"windows": 4, "seeds": [0]}, arms=arms)
    assert "generation" not in invoke("prune", str(spec), "--arms", "uniform")
    keep = tmp_path / "run" / "prune" / "keep-0.5"
    assert (keep / "uniform" / "seed-0" / "result.json").exists()
    assert not (keep / "evolve" / "seed-0" / "search.json").exists()
    assert "generation 3/3" in invoke("prune", str(spec))


def test_a_prune_killed_mid_search_resumes_to_the_same_widths(tmp_path: Path) -> None:
    """``geospec prune`` killed (SIGKILL) after a few generations of its search, then run
    again: it resumes after the last generation saved and ends with the widths and trajectory
    of the same prune never interrupted."""
    evolve = EVOLVE | {"generations": 60}
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "evolve", "schedule": {"kind": "evolve"} | evolve},
    ]
    runs = {}
    for name in ("whole", "killed"):
        (tmp_path / name).mkdir()
        calibration = {"windows": 4, "seeds": [0]}
        runs[name] = prune_spec(tmp_path / name, keep=0.5, calibration=calibration, arms=arms)
    invoke("prune", str(runs["whole"]))
    state = tmp_path / "killed" / "run" / "prune" / "keep-0.5" / "evolve" / "seed-0" / "search.json"
    # on one thread, as this module's own prunes: another count sums in another order
    process = subprocess.Popen(
        [sys.executable, "-m", "geospec", "prune", str(runs["killed"])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(OSError, ValueError, KeyError):
                if len(trajectory(state)) >= 5:
                    break
            time.sleep(0.01)
    finally:
        process.kill()
        process.wait()
    saved = len(trajectory(state))
    assert 5 <= saved < 60  # killed mid-search
    output = invoke("prune", str(runs["killed"]))
    assert f"generation {saved + 1}/60" in output and f"generation {saved}/60" not in output
    unit = Path("run/prune/keep-0.5/evolve/seed-0/result.json")
    whole, killed = (json.loads((tmp_path / name / unit).read_text()) for name in runs)
    assert killed["widths"] == whole["widths"] and killed["search"] == whole["search"]


def test_a_search_from_protect_on_the_loss_moves_from_its_widths(
    setting: tuple, tmp_path: Path
) -> None:
    """``start = { kind = "protect", first = 1 }`` starts at protect's widths (layer 0 whole,
    the others sharing the rest); on the loss fitness too, each generation's widths are at most
    three swaps from the last's, moved exactly when the trajectory says so, and keep the
    budget."""
    start = {"kind": "protect", "first": 1}
    path = tmp_path / "search.json"
    search(setting, path, start=start, fitness="loss", generations=4, offspring=4, min_width=16)
    protect = create_plugin("schedule", start).widths_from(DIMS, {}, {})
    assert protect == [48, 24, 24]
    previous = protect
    for step in trajectory(path):
        assert sum(step["widths"]) == 96
        moved = sum(abs(a - b) for a, b in zip(step["widths"], previous, strict=True))
        assert moved <= 2 * 3 * 8 and (moved > 0) == step["accepted"]
        previous = step["widths"]


def tracked_truth(setting: tuple, path: Path, **params: Any) -> list[float]:
    """The direct KL, on the search's tracked windows, of its start (uniform) and of the parent
    after each generation of the search saved in ``path``."""
    table = {
        "kind": "evolve",
        "stages": [{"tokens": 30, "survivors": 2}, {"tokens": 90, "survivors": 1}],
    }
    schedule = create_plugin("schedule", table | params)
    evolution = Evolution(schedule.params)
    rows = evolution.tracked_windows(fitness_of(setting), 6)  # the last stage's 90 tokens
    parents = [[32, 32, 32]] + [step["widths"] for step in trajectory(path)]
    return [direct_kl(setting, widths, rows) for widths in parents]


@pytest.mark.parametrize("patience", [1, 3])
def test_patience_stops_the_search_once_the_tracked_parent_stops_improving(
    setting: tuple, tmp_path: Path, patience: int
) -> None:
    """Every new parent is scored on fixed windows (its KL there equals the direct KL of the
    truly cut model); the search stops at the first generation ``patience`` generations after
    the last at which that KL fell (patience 1: the first generation without a better parent),
    and says so in its state; the widths it returns are its last parent's."""
    path = tmp_path / "search.json"
    params: dict[str, Any] = {"generations": 40, "offspring": 4, "seed": 1, "patience": patience}
    found = search(setting, path, **params)
    state = json.loads(path.read_text())["state"]
    steps = state["trajectory"]
    truth = tracked_truth(setting, path, **params)
    assert state["tracked_start"] == pytest.approx(truth[0], rel=1e-5)
    assert [step["tracked"] for step in steps] == pytest.approx(truth[1:], rel=1e-5)
    # the stop, from the direct KLs: the first generation g with g - (the first generation at
    # the lowest KL so far) = patience
    expected = next(
        g for g in range(1, len(truth)) if g - int(np.argmin(truth[: g + 1])) >= patience
    )
    assert len(steps) == expected < 40
    assert state["stopped"] == {
        "by": "patience", "generation": expected, "best_generation": expected - patience,
        "patience": patience,
    }  # fmt: skip
    assert found == steps[-1]["widths"]


def test_a_search_whose_patience_outlasts_it_stops_at_its_cap(
    setting: tuple, tmp_path: Path
) -> None:
    path = tmp_path / "search.json"
    search(setting, path, generations=3, offspring=4, patience=5)
    state = json.loads(path.read_text())["state"]
    assert len(state["trajectory"]) == 3
    assert state["stopped"] == {"by": "generations", "generation": 3}


def test_a_killed_search_with_patience_resumes_to_the_same_stop(
    setting: tuple, tmp_path: Path
) -> None:
    """Killed after generation 2 and started again, a search with patience ends where the
    uninterrupted one does (widths, trajectory with its tracked values, why it stopped);
    started again once stopped, it runs no generation and returns the same widths."""
    params: dict[str, Any] = {"generations": 40, "offspring": 4, "seed": 1, "patience": 3}
    whole = search(setting, tmp_path / "a.json", **params)
    with pytest.raises(Killed):
        search(setting, tmp_path / "b.json", after=2, **params)
    assert search(setting, tmp_path / "b.json", **params) == whole
    a, b = (json.loads((tmp_path / f"{n}.json").read_text())["state"] for n in "ab")
    assert a == b and a["stopped"]["by"] == "patience"
    said: list[str] = []
    assert search(setting, tmp_path / "a.json", said, **params) == whole
    assert said == []


def test_patience_left_unset_keeps_the_prune_key(tmp_path: Path) -> None:
    """An evolve table without patience or kl_top_k dumps the keys it had before they existed,
    so the prune stage's key of an existing spec is unchanged; set, each is part of the key."""
    from geospec.pipeline.keys import section
    from geospec.spec.sections import PruneArmSpec

    before = {
        "kind", "start", "start_arm", "generations", "offspring", "stages", "step",
        "min_width", "max_width", "fitness", "seed",
    }  # fmt: skip
    plain = PruneArmSpec(name="searched", schedule={"kind": "evolve"})
    assert set(section(plain)["schedule"]) == before
    patient = PruneArmSpec(name="searched", schedule={"kind": "evolve", "patience": 5})
    assert section(patient)["schedule"]["patience"] == 5
    lumped = PruneArmSpec(name="searched", schedule={"kind": "evolve", "kl_top_k": 64})
    assert set(section(lumped)["schedule"]) == before | {"kl_top_k"}


def test_a_search_starts_from_protect_ends_through_the_prune(tmp_path: Path) -> None:
    """``start_arm`` names any prune arm, protect-ends (the first and last layers whole) among
    them: the search's first generation moves from protect-ends' widths (at most three swaps),
    and every generation keeps the budget."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "protect-ends", "schedule": {"kind": "protect", "first": 1, "last": 1}},
        {"name": "evolve", "schedule": {"kind": "evolve", "start_arm": "protect-ends"} | EVOLVE},
    ]
    spec = prune_spec(tmp_path, keep=0.75, calibration={"windows": 4, "seeds": [0]}, arms=arms)
    invoke("prune", str(spec))
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    start = record["budgets"][0]["arms"]["protect-ends"]["widths"]["0"]
    assert start == [64, 16, 64]
    unit = tmp_path / "run" / "prune" / "keep-0.75" / "evolve" / "seed-0"
    previous = start
    for step in json.loads((unit / "result.json").read_text())["search"]["trajectory"]:
        moved = sum(abs(a - b) for a, b in zip(step["widths"], previous, strict=True))
        assert sum(step["widths"]) == 144 and moved <= 2 * 3 * 8
        assert (moved > 0) == step["accepted"]
        previous = step["widths"]


def lumped_by_masks(teacher: torch.Tensor, student: torch.Tensor, k: int) -> torch.Tensor:
    """KL(P' || Q') summed over positions, P' and Q' the teacher's and student's next-token
    distributions coarsened to the teacher's k most likely tokens and one bucket of the rest
    (built with boolean masks, scored by torch.nn.functional.kl_div)."""
    p, q = teacher.double().softmax(-1), student.double().softmax(-1)
    mask = torch.zeros_like(p, dtype=torch.bool).scatter(-1, p.topk(k, -1).indices, True)
    coarse_p = torch.cat([p[mask].view(-1, k), (p * ~mask).sum(-1, keepdim=True)], -1)
    coarse_q = torch.cat([q[mask].view(-1, k), (q * ~mask).sum(-1, keepdim=True)], -1)
    return F.kl_div(coarse_q.log(), coarse_p, reduction="sum")


def test_the_lumped_kl_is_the_kl_of_the_coarsened_distributions(setting: tuple) -> None:
    """In float64: at k = the vocabulary the lumped KL is the full KL (torch's kl_div on the
    full logits); below it, the KL of the two distributions coarsened to the teacher's top k
    and one bucket (computed with masks), never above the full KL. In float32, a top-k fitness
    at the vocabulary scores candidates as the full one does."""
    import copy

    from geospec.prune.search import lumped_kl, lumped_teacher

    model, sites, _, orders, batches = setting
    exact = copy.deepcopy(model).double()
    inputs = batches[0][0]
    with torch.no_grad():
        exact_sites = find_ffn_sites(exact, hf_models.WIDTH, lambda: logits_of(exact, inputs))
        teacher = logits_of(exact, inputs).flatten(0, 1)
        with pruned(exact_sites, orders, [24, 40, 32]):
            student = logits_of(exact, inputs).flatten(0, 1)

            def kl(k: int) -> float:
                packed = lumped_teacher(teacher.log_softmax(-1), k).view(*inputs.shape, -1)
                return float(lumped_kl(exact, inputs, packed))

            full = float(
                F.kl_div(student.log_softmax(-1), teacher.log_softmax(-1), reduction="sum",
                         log_target=True)
            )  # fmt: skip
            assert kl(hf_models.VOCAB) == pytest.approx(full, rel=1e-9)
            for k in (1, 5, 40):
                coarse = float(lumped_by_masks(teacher, student, k))
                assert kl(k) == pytest.approx(coarse, rel=1e-9)
                assert kl(k) < full
    candidates = [[40, 32, 24], [32, 40, 24], [24, 40, 32]]
    values = fitness_of(setting)(candidates, [0, 2, 4], base=[40, 32, 24])
    top = CalibrationFitness(model, sites, orders, batches, "kl", 4, top_k=hf_models.VOCAB)
    # float32 log-probabilities (1e-7 apart) against a KL of 0.004 a position
    assert top(candidates, [0, 2, 4], base=[40, 32, 24]) == pytest.approx(values, rel=1e-4)


def test_a_start_arm_naming_a_grid_names_its_settings(tmp_path: Path) -> None:
    """A grid's best setting is chosen after every arm's widths, so ``start_arm`` names one of
    its settings: naming the grid is one line listing them, exit 2."""
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "owl", "schedule": {"kind": "owl"}, "grid": {"lam": [0.05, 0.1]}},
        {"name": "evolve", "schedule": {"kind": "evolve", "start_arm": "owl"} | EVOLVE},
    ]
    spec = prune_spec(tmp_path, keep=0.5, calibration={"windows": 4, "seeds": [0]}, arms=arms)
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert (
        "prune.arms[3].schedule.start_arm: 'owl' is a grid, whose best setting is chosen after "
        "every arm's widths; name one of its settings: 'owl-lam0.05', 'owl-lam0.1'"
    ) in result.output


def test_a_lumped_search_through_the_prune_scores_below_the_full_kl(tmp_path: Path) -> None:
    """Two searches of one seed, one stage (every candidate scored on the same windows), the
    second with ``kl_top_k = 3``: its first generation's best fitness, a minimum of coarsened
    KLs of the same candidates, is below the full search's."""
    lumped = EVOLVE | {"generations": 1, "kl_top_k": 3}
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "full", "schedule": {"kind": "evolve"} | EVOLVE | {"generations": 1}},
        {"name": "lumped", "schedule": {"kind": "evolve"} | lumped},
    ]
    spec = prune_spec(tmp_path, keep=0.5, calibration={"windows": 4, "seeds": [0]}, arms=arms)
    invoke("prune", str(spec))
    record = json.loads((tmp_path / "run" / "prune.json").read_text())
    full, top = (record["budgets"][0]["arms"][name]["search"]["0"] for name in ("full", "lumped"))
    assert 0 < top["fitness"][0] < full["fitness"][0]


def test_evolve_with_patience_and_a_lumped_kl_keeps_the_schedule_contract() -> None:
    """The plugin kit's schedule check (its made-up fitness, a state kept nowhere) passes an
    evolve with patience and kl_top_k as it passes the default one."""
    from test_contracts import PRUNED

    from geospec import testing
    from geospec.plugin import get_registries

    cls = get_registries()["schedule"].get("evolve").cls
    testing.check_schedule(cls, {"patience": 2, "kl_top_k": 8, "generations": 5}, dims=PRUNED)
