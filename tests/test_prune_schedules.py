"""The literature's pruning allocations (flap, owl, owl_neuron) on hand-worked cases, and the
pretrained width as every solver's upper limit (ModelDims.max_width)."""

from __future__ import annotations

import pytest

from geospec.errors import UsageError
from geospec.kinds import BlockLinears, LinearInputs, ModelDims, ScoreAllocation, reads_scores
from geospec.plugin import create_plugin


def schedule(table: dict[str, object]) -> object:
    return create_plugin("schedule", table)


def test_flap_keeps_the_best_standardised_neurons_over_all_layers() -> None:
    """Layer 0 [1, 2, 3, 4]: mean 2.5, sample sd 1.291, z = (-1.162, -0.387, 0.387, 1.162);
    layer 1 [10, 10, 10, 50]: mean 20, sample sd 20, z = (-0.5 x 3, 1.5). Keeping 4 of 8
    removes 4: FLAP's threshold is the best removed z (the 5th best, -0.5) and a neuron stays
    when strictly above it: 1.5, 1.162, 0.387, -0.387, so layer 0 keeps 3 and layer 1 keeps 1,
    although layer 1's raw scores are all larger."""
    flap = schedule({"kind": "flap"})
    dims = ModelDims(n_layers=2, d_model=8, ffn_width=2, multiple_of=1, max_width=4)
    assert isinstance(flap, ScoreAllocation) and reads_scores(flap)
    widths = flap.widths_from_scores(dims, [[1, 2, 3, 4], [10, 10, 10, 50]])
    assert widths == [3, 1]


def test_flap_removes_a_tie_at_its_threshold_as_flaps_code_does() -> None:
    """FLAP's mask is ``metric > sorted[-removed]`` (lib/prune.py lines 383-385): layer 0's four
    equal scores standardise to 0 (sd 0); layer 1 [0, 0, 0, 4] (mean 1, sample sd 2) to
    (-0.5 x 3, 1.5). Keeping 4 of 8: the pooled z, best first, 1.5, 0, 0, 0, 0, -0.5, -0.5,
    -0.5; the best removed one is 0, so only 1.5 is strictly above it: counts (0, 1). Nothing
    to remove keeps every neuron."""
    flap = schedule({"kind": "flap"})
    assert flap.counts([[1.0] * 4, [0.0, 0.0, 0.0, 4.0]], 4) == [0, 1]  # type: ignore[attr-defined]
    assert flap.counts([[1.0, 2.0], [3.0, 5.0]], 4) == [2, 2]  # type: ignore[attr-defined]
    dims = ModelDims(n_layers=2, d_model=8, ffn_width=2, multiple_of=1, max_width=4)
    widths = flap.widths_from_scores(dims, [[1.0] * 4, [0.0, 0.0, 0.0, 4.0]])  # type: ignore[attr-defined]
    assert sum(widths) == 4 and all(1 <= w <= 4 for w in widths)


def test_flap_rounds_to_multiples_with_the_exact_budget() -> None:
    flap = schedule({"kind": "flap"})
    scores = [[float(i) for i in range(16)], [float(i * i) for i in range(16)], [1.0] * 16]
    dims = ModelDims(n_layers=3, d_model=8, ffn_width=8, multiple_of=4, max_width=16)
    widths = flap.widths_from_scores(dims, scores)  # type: ignore[attr-defined]
    assert sum(widths) == 24 and all(w % 4 == 0 and 4 <= w <= 16 for w in widths)


def test_owl_neuron_spreads_keep_ratios_by_outlier_ratio() -> None:
    """Layer 0: one score of 20 among nine 1s (mean 2.9; above 5 x 2.9 = 14.5: D = 0.1);
    layer 1: all 1s (D = 0). Keep ratios: 0.5 + (0.16, 0) - 0.08 = (0.58, 0.42); widths
    5.8 and 4.2 of 10 neurons round to 6 and 4."""
    owl = schedule({"kind": "owl_neuron"})
    scores = [[1.0] * 9 + [20.0], [1.0] * 10]
    assert owl.outlier_ratios(scores) == [0.1, 0.0]  # type: ignore[attr-defined]
    assert owl.keep_ratios(scores, 0.5) == pytest.approx([0.58, 0.42])  # type: ignore[attr-defined]
    dims = ModelDims(n_layers=2, d_model=8, ffn_width=5, multiple_of=1, max_width=10)
    assert owl.widths_from_scores(dims, scores) == [6, 4]  # type: ignore[attr-defined]
    wider = schedule({"kind": "owl_neuron", "lam": 0.2, "m": 3.0})
    assert wider.keep_ratios(scores, 0.5) == pytest.approx([0.7, 0.3])  # type: ignore[attr-defined]


def test_owl_neuron_with_equal_outlier_ratios_is_uniform() -> None:
    owl = schedule({"kind": "owl_neuron"})
    dims = ModelDims(n_layers=3, d_model=8, ffn_width=8, multiple_of=4, max_width=16)
    assert owl.widths_from_scores(dims, [[1.0] * 16] * 3) == [8, 8, 8]  # type: ignore[attr-defined]


def hand_blocks() -> list[BlockLinears]:
    """Three decoder layers of two linear maps each, their Wanda scores |W_ij| x rms_j:
    layer 0: A = |[[1, 1], [1, 1]]| x (1, 1) = (1, 1, 1, 1), B = |[[1, -10]]| x (1, 2) = (1, 20);
    layer 1: every score 1; layer 2: A = [[1, 1], [1, 1]] x (1, 3) = (1, 3, 1, 3),
    B = |[[-2, 0]]| x (1, 3) = (2, 0)."""
    import torch

    def linear(weight: list[list[float]], rms: list[float]) -> LinearInputs:
        return LinearInputs("x", torch.tensor(weight), torch.tensor(rms, dtype=torch.float64))

    ones = linear([[1.0, 1.0], [1.0, 1.0]], [1.0, 1.0])
    return [
        BlockLinears(0, (ones, linear([[1.0, -10.0]], [1.0, 2.0]))),
        BlockLinears(1, (ones, linear([[1.0, 1.0]], [1.0, 1.0]))),
        BlockLinears(
            2, (linear([[1.0, 1.0], [1.0, 1.0]], [1.0, 3.0]), linear([[-2.0, 0.0]], [1.0, 3.0]))
        ),
    ]


@pytest.mark.torch
def test_owl_counts_outliers_among_the_per_weight_scores_of_the_whole_block() -> None:
    """With m = 1.5: layer 0 pools (1, 1, 1, 1, 1, 20), mean 25/6, threshold 6.25: one of six
    (D = 1/6); layer 1: mean 1, threshold 1.5: none; layer 2 pools (1, 3, 1, 3, 2, 0), mean
    10/6, threshold 2.5: two of six (D = 1/3). OWL's map (lib/prune_all.py lines 962-966):
    (D - 0) / (1/3) x 2 x 0.08 = (0.08, 0, 0.16), minus its mean 0.08, plus 0.5: keep ratios
    (0.5, 0.42, 0.58); of 100 neurons a layer, widths (50, 42, 58). At OWL's m = 5 no weight
    of any layer is an outlier (20 < 5 x 25/6): equal ratios, uniform widths."""
    owl = schedule({"kind": "owl", "m": 1.5})
    assert isinstance(owl, ScoreAllocation) and owl.reads_block_linears
    blocks = hand_blocks()
    assert owl.outlier_ratios(blocks) == pytest.approx([1 / 6, 0.0, 1 / 3])  # type: ignore[attr-defined]
    assert owl.keep_ratios(blocks, 0.5) == pytest.approx([0.5, 0.42, 0.58])  # type: ignore[attr-defined]
    dims = ModelDims(n_layers=3, d_model=8, ffn_width=50, multiple_of=1, max_width=100)
    scores = [[1.0] * 100] * 3
    assert owl.widths_from_blocks(dims, scores, blocks) == [50, 42, 58]
    default = schedule({"kind": "owl"})
    assert default.outlier_ratios(blocks) == [0.0, 0.0, 0.0]  # type: ignore[attr-defined]
    assert default.widths_from_blocks(dims, scores, blocks) == [50, 50, 50]  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="'owl_neuron' allocates from neuron scores alone"):
        owl.widths_from_scores(dims, scores)


@pytest.mark.torch
def test_owl_caps_a_layer_at_its_pretrained_width_and_keeps_the_budget() -> None:
    """At keep 0.95 with lam 0.08, layer 2's keep ratio 1.03 would grow it: it stays at 100
    and the budget (285) goes to the others."""
    owl = schedule({"kind": "owl", "m": 1.5})
    dims = ModelDims(n_layers=3, d_model=8, ffn_width=95, multiple_of=5, max_width=100)
    widths = owl.widths_from_blocks(dims, [[1.0] * 100] * 3, hand_blocks())  # type: ignore[attr-defined]
    assert widths[2] == 100 and sum(widths) == 285 and all(w % 5 == 0 for w in widths)


@pytest.mark.parametrize("kind", ["flap", "owl", "owl_neuron"])
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


@pytest.mark.parametrize("kind", ["flap", "owl", "owl_neuron"])
def test_a_pruning_allocation_is_refused_as_a_training_arm(kind: str) -> None:
    from geospec.errors import SpecError
    from geospec.spec.loading import validate_spec
    from geospec.testing import minimal_spec

    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}}, {"name": "x", "schedule": kind}]
    with pytest.raises(SpecError) as error:
        validate_spec(minimal_spec(arms=arms))
    assert "arms[1].schedule.kind" in str(error.value) and "[prune] arms" in str(error.value)
