"""The literature's pruning allocations (flap, owl) on hand-worked cases, and the pretrained
width as every solver's upper limit (ModelDims.max_width)."""

from __future__ import annotations

import pytest

from geospec.errors import UsageError
from geospec.kinds import ModelDims, ScoreAllocation, reads_scores
from geospec.plugin import create_plugin


def schedule(table: dict[str, object]) -> object:
    return create_plugin("schedule", table)


def test_flap_keeps_the_best_standardised_neurons_over_all_layers() -> None:
    """Layer 0 [1, 2, 3, 4]: z = (-1.342, -0.447, 0.447, 1.342); layer 1 [10, 10, 10, 50]:
    z = (-0.577 x 3, 1.732). The 4 best z over both layers: 1.732, 1.342, 0.447, -0.447, so
    layer 0 keeps 3 and layer 1 keeps 1, although layer 1's raw scores are all larger."""
    flap = schedule({"kind": "flap"})
    dims = ModelDims(n_layers=2, d_model=8, ffn_width=2, multiple_of=1, max_width=4)
    assert isinstance(flap, ScoreAllocation) and reads_scores(flap)
    widths = flap.widths_from_scores(dims, [[1, 2, 3, 4], [10, 10, 10, 50]])
    assert widths == [3, 1]


def test_flap_rounds_to_multiples_with_the_exact_budget() -> None:
    flap = schedule({"kind": "flap"})
    scores = [[float(i) for i in range(16)], [float(i * i) for i in range(16)], [1.0] * 16]
    dims = ModelDims(n_layers=3, d_model=8, ffn_width=8, multiple_of=4, max_width=16)
    widths = flap.widths_from_scores(dims, scores)  # type: ignore[attr-defined]
    assert sum(widths) == 24 and all(w % 4 == 0 and 4 <= w <= 16 for w in widths)


def test_owl_spreads_keep_ratios_by_outlier_ratio() -> None:
    """Layer 0: one score of 20 among nine 1s (mean 2.9; above 5 x 2.9 = 14.5: D = 0.1);
    layer 1: all 1s (D = 0). Keep ratios: 0.5 + (0.16, 0) - 0.08 = (0.58, 0.42); widths
    5.8 and 4.2 of 10 neurons round to 6 and 4."""
    owl = schedule({"kind": "owl"})
    scores = [[1.0] * 9 + [20.0], [1.0] * 10]
    assert owl.outlier_ratios(scores) == [0.1, 0.0]  # type: ignore[attr-defined]
    assert owl.keep_ratios(scores, 0.5) == pytest.approx([0.58, 0.42])  # type: ignore[attr-defined]
    dims = ModelDims(n_layers=2, d_model=8, ffn_width=5, multiple_of=1, max_width=10)
    assert owl.widths_from_scores(dims, scores) == [6, 4]  # type: ignore[attr-defined]
    wider = schedule({"kind": "owl", "lam": 0.2, "m": 3.0})
    assert wider.keep_ratios(scores, 0.5) == pytest.approx([0.7, 0.3])  # type: ignore[attr-defined]


def test_owl_with_equal_outlier_ratios_is_uniform() -> None:
    owl = schedule({"kind": "owl"})
    dims = ModelDims(n_layers=3, d_model=8, ffn_width=8, multiple_of=4, max_width=16)
    assert owl.widths_from_scores(dims, [[1.0] * 16] * 3) == [8, 8, 8]  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["flap", "owl"])
def test_neuron_score_allocations_need_scores(kind: str) -> None:
    dims = ModelDims(n_layers=2, d_model=8, ffn_width=4, multiple_of=1)
    with pytest.raises(
        UsageError, match=rf"^'{kind}' allocates from the neuron scores .*\[prune\]"
    ):
        schedule({"kind": kind}).widths(dims, {})  # type: ignore[attr-defined]


def test_max_width_caps_every_solver() -> None:
    """A profile that would give layer 0 most of the budget: with max_width it keeps at most the
    pretrained width, and the rest goes to the others."""
    geometric = schedule({"kind": "geometric", "profile": "p", "solver": {"kind": "proportional"}})
    free = ModelDims(n_layers=3, d_model=8, ffn_width=48, multiple_of=8)
    capped = ModelDims(n_layers=3, d_model=8, ffn_width=48, multiple_of=8, max_width=64)
    profiles = {"p": [10.0, 1.0, 1.0]}
    assert max(geometric.widths(free, profiles)) > 64  # type: ignore[attr-defined]
    widths = geometric.widths(capped, profiles)  # type: ignore[attr-defined]
    assert widths[0] == 64 and sum(widths) == 144 and max(widths) <= 64


@pytest.mark.parametrize("kind", ["flap", "owl"])
def test_a_pruning_allocation_is_refused_as_a_training_arm(kind: str) -> None:
    from geospec.errors import SpecError
    from geospec.spec.loading import validate_spec
    from geospec.testing import minimal_spec

    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}}, {"name": "x", "schedule": kind}]
    with pytest.raises(SpecError) as error:
        validate_spec(minimal_spec(arms=arms))
    assert "arms[1].schedule.kind" in str(error.value) and "[prune] arms" in str(error.value)
