"""The evolutionary search over repaired levels: a candidate's fitness is its allocation pruned
and repaired from scratch, the levels' cache stays within its bound without changing a number,
a repaired search runs through `geospec prune` and is keyed apart from a cut one, and validate
counts what it holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hf_models
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from test_evolve import EVOLVE, setting  # noqa: F401  (the tiny Llama's fixture)
from test_prune import invoke, prune_spec

from geospec.cli import cli
from geospec.measure.sensitivity import logits_of
from geospec.prune.cut import pruned
from geospec.prune.repair import calibration_moments, one_pass_refits
from geospec.prune.search import CalibrationFitness, RepairedLevels
from geospec.rundir.layout import REPAIR_FILE

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

BASE = [40, 32, 24]
CANDIDATES = [[40, 32, 24], [32, 40, 24], [40, 24, 32], [24, 40, 32], [48, 16, 32]]


def levels_of(case: tuple, repair: str, bound: int | None = None) -> RepairedLevels:
    model, sites, _, orders, batches = case
    moments = calibration_moments(model, sites, batches)
    if repair == "mean":
        return RepairedLevels(sites, orders, means=[m.mean for m in moments])
    limit = {} if bound is None else {"bound": bound}
    return RepairedLevels(
        sites, orders, moments=moments, damping=0.1, intercept=repair == "lstsq", **limit
    )


def scratch_kl(case: tuple, widths: list[int], rows: list[int], repair: str) -> float:
    """The mean per-token KL(unpruned || pruned) on windows ``rows``, the model pruned to
    ``widths`` and repaired from scratch as a unit is (every layer's re-fit from the unpruned
    model's moments by one_pass_refits, or mean compensation), by kl_div on the full logits."""
    model, sites, _, orders, batches = case
    moments = calibration_moments(model, sites, batches)
    means, refits = None, None
    if repair == "mean":
        means = [m.mean for m in moments]
    else:
        refits = one_pass_refits(sites, moments, orders, widths, 0.1, repair == "lstsq")
    inputs = torch.cat([x for x, _ in batches])[rows]
    with torch.no_grad():
        teacher = logits_of(model, inputs).flatten(0, 1).log_softmax(-1)
        with pruned(sites, orders, widths, means, refits):
            student = logits_of(model, inputs).flatten(0, 1).log_softmax(-1)
    return float(F.kl_div(student, teacher, reduction="batchmean", log_target=True))


@pytest.mark.parametrize("repair", ["lstsq", "lstsq-no-intercept", "mean"])
def test_a_candidates_fitness_over_repaired_levels_is_its_allocation_repaired_from_scratch(
    setting: tuple,  # noqa: F811
    repair: str,
) -> None:
    """Each candidate's KL over repaired levels (each run from its first layer that differs
    from the base, or without a base) is the KL of its allocation pruned and repaired from
    scratch; the repair moves it away from the plain cut's; the model is left as it was."""
    model, sites, _, orders, batches = setting
    before = [(name, id(param)) for name, param in model.named_parameters()]
    levels = levels_of(setting, repair)
    fitness = CalibrationFitness(model, sites, orders, batches, "kl", 4, levels=levels)
    rows = [5, 1, 3]
    got = fitness(CANDIDATES, rows, base=BASE)
    assert fitness.fallback is None
    cut = CalibrationFitness(model, sites, orders, batches, "kl", 4)(CANDIDATES, rows, base=BASE)
    for widths, value, plain in zip(CANDIDATES, got, cut, strict=True):
        assert value == pytest.approx(scratch_kl(setting, widths, sorted(rows), repair), rel=1e-5)
        assert abs(value - plain) > 1e-3 * plain
    assert fitness(CANDIDATES, rows) == pytest.approx(got, rel=1e-9)
    assert [(name, id(param)) for name, param in model.named_parameters()] == before
    if repair != "mean":  # every level of the candidates solved once, then reused
        visited = {(layer, w) for c in [*CANDIDATES, BASE] for layer, w in enumerate(c) if w < 48}
        assert levels.solved == len(visited) and levels.reused > 0


def test_the_levels_cache_keeps_its_bound_and_the_same_numbers(
    setting: tuple,  # noqa: F811
) -> None:
    """With room for two levels' re-fits, the cache never holds more, solves levels again as
    they are dropped, and every fitness is the unbounded cache's, bit for bit."""
    model, sites, _, orders, batches = setting
    one = (
        hf_models.WIDTH * 40 * 4 + 8 * hf_models.WIDTH
    )  # a re-fit at 40 neurons: float32 and its bias
    values = {}
    caches = {}
    for bound in (2 * one, None):
        levels = levels_of(setting, "lstsq", bound)
        fitness = CalibrationFitness(model, sites, orders, batches, "kl", 4, levels=levels)
        values[bound] = [fitness(CANDIDATES, [0, 2], base=BASE) for _ in range(2)]
        caches[bound] = levels
    assert values[2 * one] == values[None]
    small, whole = caches[2 * one], caches[None]
    assert small.peak <= 2 * one and small.held <= 2 * one
    assert small.solved > whole.solved and whole.peak > 2 * one


def test_repaired_levels_refuse_the_zeroed_cut(
    setting: tuple,  # noqa: F811
) -> None:
    model, sites, _, orders, batches = setting
    with pytest.raises(ValueError, match="true widths"):
        CalibrationFitness(
            model, sites, orders, batches, "kl", 4, cut="zero", levels=levels_of(setting, "mean")
        )


def unit_dir(run: Path, arm: str) -> Path:
    return run / "run" / "prune" / "keep-0.5" / arm / "seed-0"


def test_a_repaired_search_runs_through_the_prune(tmp_path: Path) -> None:
    """Searches over least-squares and mean-compensated levels through geospec prune: each
    says what it searches over, ends at its last parent, and its winner is repaired as its arm
    says; the one-pass and the sequential arm search the same levels (both from the unpruned
    model's moments), so the same path, and differ only in their winner's repair."""
    evolve: dict[str, Any] = {"kind": "evolve"} | EVOLVE
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "lstsq", "schedule": evolve, "repair": "lstsq"},
        {"name": "walk", "schedule": evolve, "repair": "lstsq", "lstsq": {"inputs": "sequential"}},
        {"name": "mean", "schedule": evolve, "repair": "mean"},
        {"name": "cut", "schedule": evolve},
    ]
    spec = prune_spec(
        tmp_path, keep=0.5, calibration={"windows": 4, "seeds": [0]}, arms=arms, export=False
    )
    output = " ".join(invoke("prune", str(spec)).split())
    assert "over least-squares levels from the unpruned model's inputs (damping 0.1" in output
    assert "over mean-compensated levels" in output and "over cut levels" in output
    record = json.loads((tmp_path / "run" / "prune.json").read_text())["budgets"][0]["arms"]
    paths = {}
    for arm in ("lstsq", "walk", "mean", "cut"):
        result = json.loads((unit_dir(tmp_path, arm) / "result.json").read_text())
        paths[arm] = result["search"]["trajectory"]
        assert record[arm]["widths"]["0"] == paths[arm][-1]["widths"]
        assert (unit_dir(tmp_path, arm) / REPAIR_FILE).exists() == (arm in ("lstsq", "walk"))
    assert paths["lstsq"] == paths["walk"]
    assert paths["lstsq"] != paths["cut"] and paths["mean"] != paths["cut"]
    loss = {arm: record[arm]["loss"]["docs.jsonl"]["0"] for arm in ("lstsq", "walk")}
    assert loss["lstsq"] != loss["walk"]


def test_a_repaired_search_is_keyed_apart_and_others_keep_their_keys(tmp_path: Path) -> None:
    """An evolve arm whose levels are repaired names them in its key (a stored search over cut
    levels of the same spec is not resumed); every other arm's key, a cut search's among them,
    is the key it had before levels were repaired."""
    from geospec.prune.units import arm_keys, keyed_prune, repaired_searches
    from geospec.spec.loading import load_spec

    evolve = {"kind": "evolve"} | EVOLVE
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}, "repair": "lstsq"},
        {"name": "searched", "schedule": evolve, "repair": "lstsq"},
        {"name": "cut", "schedule": evolve},
        {"name": "from-searched", "schedule": evolve | {"start_arm": "searched"}},
    ]
    prune = load_spec(prune_spec(tmp_path, keep=0.5, arms=arms)).prune
    assert prune is not None
    keyed = keyed_prune(prune)
    assert repaired_searches(prune) == ["searched"]
    old = arm_keys(keyed, ["common"], {}, [])
    new = arm_keys(keyed, ["common"], {}, [], repaired_searches(prune))
    assert {name for name in old if old[name] != new[name]} == {"searched", "from-searched"}


def test_validate_counts_the_repaired_levels(tmp_path: Path) -> None:
    """A search over least-squares levels holds every layer's moments from one pass (whatever
    inputs its winner is repaired from) and its levels' re-fits: validate says both, and a
    machine without room for them is told to search cut levels."""
    from geospec.spec.file_checks import repair_memory_problem
    from geospec.spec.loading import load_spec
    from geospec.storage.disk import size

    evolve = {"kind": "evolve"} | EVOLVE
    arms = [
        {"name": "uniform", "schedule": {"kind": "uniform"}},
        {"name": "walk", "schedule": evolve, "repair": "lstsq", "lstsq": {"inputs": "sequential"}},
    ]
    spec_file = prune_spec(tmp_path, keep=0.5, arms=arms)
    result = CliRunner().invoke(cli, ["validate", str(spec_file)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    one_layer = 8 * (64 * 64 + 64)  # the word checkpoint: 3 layers of 64 neurons, d_model 32
    # every width a level may have (8..56 neurons): a float32 32 x kept re-fit, a float64 bias
    levels = 3 * sum(4 * 32 * kept + 8 * 32 for kept in range(8, 64, 8))
    assert f"float64 moments {one_layer * 3 / 1024:.1f} KiB: every layer's, one pass" in said
    assert f"the search's repaired levels {size(levels)}" in said
    line = repair_memory_problem(load_spec(spec_file), free=3 * one_layer + levels // 2)
    assert line is not None and line.startswith("prune.lstsq: the repair of walk needs")
    assert line.endswith('search cut levels (repair = "none" on the evolve arm) or use a larger '
                         "machine")  # fmt: skip
