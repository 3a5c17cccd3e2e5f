"""Pruning (geospec.prune): widths at a pruned budget, the pruned model's export as a plain
transformers checkpoint (reloaded and recomputed with transformers alone), and its loss."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import hf_models
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers as hf

from geospec.errors import UsageError
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import create_plugin
from geospec.prune.allocate import allocate, pruned_dims
from geospec.prune.apply import (
    calibration_windows,
    eval_loss,
    export_pruned,
    ffn_parameters,
    neuron_scores,
    pruned,
)
from geospec.spec.sections import ArmSpec

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def arms(*tables: tuple[str, object]) -> list[ArmSpec]:
    return [ArmSpec.model_validate({"name": n, "schedule": s}) for n, s in tables]


def test_every_arm_has_the_pruned_budget_and_no_layer_grows() -> None:
    dims = pruned_dims(n_layers=4, d_model=32, width=64, multiple=8, keep=0.5, activation="swiglu")
    assert (dims.ffn_width, dims.budget, dims.max_width) == (32, 128, 64)
    scores = [[float((i * 7 + layer) % 13) for i in range(64)] for layer in range(4)]
    profiles = {"p": [4.0, 3.0, 2.0, 1.0]}
    widths = allocate(
        arms(
            ("uniform", "uniform"),
            ("flap", "flap"),
            ("owl", "owl"),
            ("cosine", {"kind": "cosine", "start": 1.5, "end": 0.5}),
            ("geometric", {"kind": "geometric", "profile": "p"}),
            ("sorted", {"kind": "sorted", "of": "geometric"}),
        ),
        dims,
        profiles,
        scores,
    )
    assert widths["uniform"] == [32] * 4
    for name, values in widths.items():
        assert sum(values) == 128 and all(8 <= w <= 64 and w % 8 == 0 for w in values), name
    assert widths["geometric"][0] >= widths["geometric"][-1]


def test_a_schedule_that_would_grow_a_layer_is_refused_by_name() -> None:
    dims = pruned_dims(4, 32, 64, 8, keep=0.75, activation="gelu")  # uniform 48
    with pytest.raises(UsageError, match=r"prune arm 'steep'.*layer 0 would grow to 80"):
        allocate(arms(("steep", {"kind": "cosine", "start": 1.7, "end": 0.3})), dims, {}, [])
    with pytest.raises(UsageError, match="below one multiple"):
        pruned_dims(4, 32, 64, 16, keep=0.1, activation="gelu")


def test_calibration_samples_are_seeded_and_disjoint_windows() -> None:
    tokens = np.arange(1000)
    first, again = calibration_windows(tokens, 10, 20, 0), calibration_windows(tokens, 10, 20, 0)
    other = calibration_windows(tokens, 10, 20, 1)
    assert (first == again).all() and not (first == other).all()
    assert len(set(first.tolist())) == 20 and all(s % 10 == 0 and s + 10 <= 1000 for s in first)
    with pytest.raises(UsageError, match="exceeds the 100 training windows"):
        calibration_windows(tokens, 10, 101, 0)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_an_exported_pruned_model_is_a_plain_checkpoint_that_computes_the_same(
    family: str, tmp_path: Path
) -> None:
    """Pruned to uneven widths, exported padded, read back with AutoModelForCausalLM alone: the
    same logits, the true widths in config.json, and its perplexity recomputed by plain
    cross-entropy equals the one geospec measured."""
    model = hf_models.llama() if family == "llama" else hf_models.gpt2()
    ids = torch.randint(0, hf_models.VOCAB, (3, 17), generator=torch.Generator().manual_seed(0))
    sites = find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, ids[:1, :-1]))
    importance = create_plugin("importance", {"kind": "activation"})
    tokens = np.random.default_rng(0).integers(0, hf_models.VOCAB, 400)
    starts = calibration_windows(tokens, 16, 8, seed=0)
    scores, orders = neuron_scores(model, sites, importance, tokens, starts, 16, 4)
    full = sites[0].ffn.down_proj.in_features if family == "llama" else 4 * hf_models.WIDTH
    widths = [full // 2, full // 4, full // 2 + 8][: len(sites)]
    batches = [(ids[:, :-1], ids[:, 1:])]
    with torch.no_grad(), pruned(sites, orders, widths):
        expected = logits_of(model, ids[:, :-1])
        loss = eval_loss(model, batches)
        kept = ffn_parameters(sites)
        export_pruned(model, sites, widths, tmp_path / "pruned")
    assert ffn_parameters(sites) > kept  # put back
    reloaded = hf.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned").eval()
    assert reloaded.config.geospec_ffn_widths == widths
    with torch.no_grad():
        got = reloaded(input_ids=ids[:, :-1]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    plain = F.cross_entropy(got.flatten(0, 1), ids[:, 1:].flatten())
    assert float(plain) == pytest.approx(loss, rel=1e-5)
    # the orderings are the scores' (best first)
    for layer_scores, order in zip(scores, orders, strict=True):
        assert [layer_scores[i] for i in order] == sorted(layer_scores, reverse=True)
