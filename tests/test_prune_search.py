"""The search baseline (``greedy``): the calibration losses of one-layer changes, computed from
the changed layer on, against full forward passes of the cut model; and what a greedy search
must guarantee, checked by brute force on a tiny Llama."""

from __future__ import annotations

import hf_models
import numpy as np
import pytest
import torch

from geospec.kinds import ModelDims
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.cut import pruned
from geospec.prune.losses import eval_loss
from geospec.prune.score import calibration_windows, neuron_scores
from geospec.prune.search import SuffixCutLosses, calibration_batches

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

WIDTH = 48  # every layer's pretrained width; multiples of 8


@pytest.fixture(scope="module")
def setting() -> tuple[torch.nn.Module, list, list[list[float]], list[list[int]], list]:
    model = hf_models.llama(intermediate_size=WIDTH)
    sites = find_ffn_sites(
        model, hf_models.WIDTH, lambda: logits_of(model, torch.zeros(1, 4, dtype=torch.long))
    )
    tokens = np.random.default_rng(0).integers(0, hf_models.VOCAB, 600)
    starts = calibration_windows(tokens, 16, 6, seed=0)
    importance = create_plugin("importance", {"kind": "activation"})
    scores, orders = neuron_scores(model, sites, importance, tokens, starts, 16, 4)
    batches = calibration_batches(tokens, starts, 16, 4, torch.device("cpu"))
    return model, sites, scores, orders, batches


def full_loss(setting: tuple, widths: list[int]) -> float:
    """The calibration loss of the model cut to ``widths`` (modules rebuilt), by full passes."""
    model, sites, _, orders, batches = setting
    with torch.no_grad(), pruned(sites, orders, widths):
        return eval_loss(model, batches)


def test_a_change_from_its_layer_on_scores_what_the_cut_model_scores(setting: tuple) -> None:
    model, sites, _, orders, batches = setting
    losses = SuffixCutLosses(model, sites, orders, batches)
    assert losses.fallback is None  # the tiny Llama runs from a layer on
    base = [40, 32, 48]
    changes = [(0, 8), (1, 24), (2, 40), (2, 16)]
    got = losses(base, changes)
    for (layer, width), value in zip(changes, got, strict=True):
        widths = list(base)
        widths[layer] = width
        assert value == pytest.approx(full_loss(setting, widths), rel=1e-6)


def greedy(setting: tuple, budget: int, step: int = 1) -> list[int]:
    model, sites, scores, orders, batches = setting
    dims = ModelDims(
        3, hf_models.WIDTH, budget // 3, 8, "swiglu", max_width=WIDTH, total_width=budget
    )
    schedule = create_plugin("schedule", {"kind": "greedy", "step": step})
    losses = SuffixCutLosses(model, sites, orders, batches)
    return schedule.widths_from_losses(dims, scores, losses)  # type: ignore[attr-defined, no-any-return]


def test_greedy_ends_at_the_best_last_move_from_where_it_stood(setting: tuple) -> None:
    """Its widths keep the budget in multiples; the search to one move more (its own path, one
    step shorter) ends one move away, and that last move scores no worse, by full passes, than
    every other layer's cut from there. (Nothing ties it to uniform: a greedy path can end worse
    than a cut it never walked towards, so that is not a property to test.)"""
    final = greedy(setting, 72)
    assert sum(final) == 72 and all(w % 8 == 0 and 8 <= w <= WIDTH for w in final)
    before = greedy(setting, 80)
    moved = [layer for layer in range(3) if final[layer] != before[layer]]
    assert len(moved) == 1 and before[moved[0]] - final[moved[0]] == 8
    chosen = full_loss(setting, final)
    for layer in range(3):
        if before[layer] > 8:
            other = list(before)
            other[layer] -= 8
            assert chosen <= full_loss(setting, other) + 1e-12


def test_one_coarse_move_is_the_best_single_cut(setting: tuple) -> None:
    """From 144 to 128 with step 2 (16 neurons), one move: the best of the three layers' cuts
    by brute force."""
    widths = greedy(setting, 128, step=2)
    options = [[WIDTH - 16 if j == layer else WIDTH for j in range(3)] for layer in range(3)]
    assert widths == min(options, key=lambda w: full_loss(setting, w))
