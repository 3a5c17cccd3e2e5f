"""Cutting FFN neurons (geospec.measure.cut) against its definition: a cut model computes what
the full model computes with those neurons' activations set to zero, on every family the probe
maps; and the builtin importance scores against their formulas."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from contextlib import ExitStack
from typing import Literal

import hf_models
import pytest
import torch
from torch import nn

from geospec.engine.model import GPT, GPTConfig
from geospec.errors import PluginError
from geospec.kinds import Importance, NeuronWeights
from geospec.measure.cut import (
    CutError,
    cut_ffn,
    ffn_cut,
    ffn_layout,
    ffn_width,
    hidden_activations,
    kept_neurons,
    kept_width,
    neuron_order,
    neuron_weights,
    zeroed_neurons,
)
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.plugin import PluginParams, create_plugin

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB = hf_models.VOCAB


def geospec_model(activation: str) -> GPT:
    torch.manual_seed(0)
    swiglu = activation == "swiglu"
    config = GPTConfig(
        vocab_size=VOCAB,
        n_layers=3,
        d_model=32,
        n_heads=4,
        n_kv_heads=2 if swiglu else None,
        seq_len=16,
        ffn_widths=[48, 80, 24],
        activation=activation,
        norm="rmsnorm" if swiglu else "layernorm",
        positions="rope" if swiglu else "learned",
        bias=not swiglu,
    )
    return GPT(config).eval()


FAMILIES: dict[str, Callable[[], tuple[nn.Module, int]]] = {
    "geospec-gelu": lambda: (geospec_model("gelu"), 32),
    "geospec-swiglu": lambda: (geospec_model("swiglu"), 32),
    "gpt2": lambda: (hf_models.gpt2(), hf_models.WIDTH),
    "llama-gqa": lambda: (hf_models.llama(), hf_models.WIDTH),
    "mistral": lambda: (hf_models.mistral(), hf_models.WIDTH),
    "qwen2": lambda: (hf_models.qwen2(), hf_models.WIDTH),
    "gemma2": lambda: (hf_models.gemma2(), hf_models.WIDTH),
}


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))


def ffns_of(model: nn.Module, width: int) -> list[nn.Module]:
    return [site.ffn for site in find_ffn_sites(model, width, lambda: logits_of(model, tokens()))]


def random_keep(width: int, count: int, seed: int) -> list[int]:
    order = torch.randperm(width, generator=torch.Generator().manual_seed(seed))
    return [int(i) for i in order[:count]]


def boost(model: nn.Module) -> None:
    """Larger FFN weights, so that zeroing a neuron changes the logits far above rounding."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 and "embed" not in name and "wte" not in name:
                parameter.mul_(4)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_cut_model_equals_the_full_model_with_those_activations_zeroed(family: str) -> None:
    model, width = FAMILIES[family]()
    boost(model)
    full = copy.deepcopy(model)
    ffns, full_ffns = ffns_of(model, width), ffns_of(full, width)
    kept = []
    for layer, ffn in enumerate(ffns):
        n = ffn_width(ffn)
        keep = random_keep(n, n // 2 + layer, seed=layer)
        kept.append(keep)
        cut_ffn(ffn, keep)
        assert ffn_width(ffn) == len(keep)
    ids = tokens(1)
    with torch.no_grad():
        cut_logits = logits_of(model, ids)
        uncut = logits_of(full, ids)
        with ExitStack() as stack:
            for ffn, keep in zip(full_ffns, kept, strict=True):
                removed = sorted(set(range(ffn_width(ffn))) - set(keep))
                stack.enter_context(zeroed_neurons(ffn, removed))
            zeroed_logits = logits_of(full, ids)
    torch.testing.assert_close(cut_logits, zeroed_logits, atol=2e-5, rtol=1e-5)
    assert (cut_logits - uncut).abs().max() > 1e-2  # the cut changed something real
    # fewer parameters by exactly the removed rows and columns
    removed = sum(ffn_width(f) - len(k) for f, k in zip(full_ffns, kept, strict=True))
    per_neuron = (
        sum(w.numel() for w in neuron_weights(full_ffns[0], 0).inputs) // ffn_width(full_ffns[0])
        + neuron_weights(full_ffns[0], 0).output.shape[0]
    )
    biases = sum(
        getattr(full_ffns[0], name).bias is not None for name in ffn_layout(full_ffns[0]).inputs
    ) * (2 if ffn_layout(full_ffns[0]).fused else 1)
    count = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in full.parameters()) - count == removed * (per_neuron + biases)


@pytest.mark.parametrize("family", ["geospec-swiglu", "gpt2", "llama-gqa"])
def test_a_temporary_cut_restores_the_same_parameters(family: str) -> None:
    model, width = FAMILIES[family]()
    ffn = ffns_of(model, width)[1]
    before = {name: p for name, p in ffn.named_parameters()}
    ids = tokens()
    with torch.no_grad():
        expected = logits_of(model, ids)
        with ffn_cut(ffn, [0, 3, 5]):
            assert ffn_width(ffn) == 3
            changed = logits_of(model, ids)
        after = logits_of(model, ids)
    assert not torch.equal(changed, expected)
    assert torch.equal(after, expected)
    assert all(p is before[name] for name, p in ffn.named_parameters())
    assert ffn_width(ffn) == len(neuron_weights(ffn, 1).output.T)


def test_neuron_weights_are_rows_of_inputs_and_columns_of_the_output() -> None:
    gpt2 = hf_models.gpt2()
    mlp = gpt2.transformer.h[0].mlp
    view = neuron_weights(mlp, 0)
    torch.testing.assert_close(view.inputs[0], mlp.c_fc.weight.T)  # Conv1D stores in x out
    torch.testing.assert_close(view.output, mlp.c_proj.weight.T)
    fused = geospec_model("swiglu").blocks[0].ffn
    gate, up = neuron_weights(fused, 0).inputs
    torch.testing.assert_close(torch.cat([gate, up]), fused.fc.weight)
    assert gate.shape == (48, 32) and neuron_weights(fused, 0).width == 48


def test_an_unknown_ffn_layout_is_refused_by_name() -> None:
    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_up_proj = nn.Linear(8, 32)
            self.down_proj = nn.Linear(16, 8)

    with pytest.raises(CutError, match=r"Experts.*gate_up_proj"):
        ffn_layout(Experts())


def test_bad_cuts_are_refused() -> None:
    ffn = geospec_model("gelu").blocks[0].ffn
    for keep, message in (([], "at least one"), ([0, 48], r"\[0, 48\)"), ([1, 1], "distinct")):
        with pytest.raises(CutError, match=message):
            cut_ffn(ffn, keep)
    assert ffn_width(ffn) == 48


def test_kept_width_rounds_to_multiples() -> None:
    assert kept_width(1536, 0.5, 64) == 768
    assert kept_width(100, 0.33, 16) == 32  # 33 rounds to two multiples of 16
    assert kept_width(100, 0.999, 16) == 96  # 99.9 rounds to 96, within the width
    with pytest.raises(CutError, match="below one multiple"):
        kept_width(64, 0.1, 16)


# importance scores


def importance(table: dict[str, object]) -> Importance:
    plugin = create_plugin("importance", table)
    assert isinstance(plugin, Importance)
    return plugin


def test_magnitude_is_the_product_of_row_and_column_norms() -> None:
    ffn = geospec_model("swiglu").blocks[1].ffn
    view = neuron_weights(ffn, 1)
    scores = importance({"kind": "magnitude"}).scores(view)
    w, proj = ffn.fc.weight.detach(), ffn.proj.weight.detach()
    for i in (0, 17, 79):
        expected = w[i].norm() * w[80 + i].norm() * proj[:, i].norm()
        assert float(scores[i]) == pytest.approx(float(expected), rel=1e-5)


def test_activation_scores_use_the_mean_absolute_hidden_activation() -> None:
    model = geospec_model("gelu")
    ffns = [block.ffn for block in model.blocks]
    ids = tokens(2)
    with torch.no_grad(), hidden_activations(ffns) as means:
        logits_of(model, ids)
        logits_of(model, ids[:1])  # two batches: the mean runs over all 36 tokens
        measured = means()
    # by hand: the hidden activation of layer 2 on every token
    captured: list[torch.Tensor] = []
    handle = ffns[2].proj.register_forward_pre_hook(lambda m, a: captured.append(a[0]))
    with torch.no_grad():
        logits_of(model, ids)
        logits_of(model, ids[:1])
    handle.remove()
    hidden = torch.cat([h.reshape(-1, 24) for h in captured])
    torch.testing.assert_close(measured[2], hidden.abs().double().mean(0))
    view = neuron_weights(ffns[2], 2, measured[2])
    scores = importance({"kind": "activation"}).scores(view)
    torch.testing.assert_close(
        scores, (hidden.abs().mean(0) * ffns[2].proj.weight.detach().norm(dim=0)), rtol=1e-5, atol=0
    )
    with pytest.raises(PluginError, match="'activation' failed on layer 2"):
        neuron_order(importance({"kind": "activation"}), neuron_weights(ffns[2], 2))


def test_random_orderings_are_seeded_per_layer() -> None:
    model = geospec_model("gelu")
    ffn = model.blocks[0].ffn
    first = neuron_order(importance({"kind": "random", "seed": 3}), neuron_weights(ffn, 0))
    again = neuron_order(importance({"kind": "random", "seed": 3}), neuron_weights(ffn, 0))
    other_layer = neuron_order(importance({"kind": "random", "seed": 3}), neuron_weights(ffn, 1))
    other_seed = neuron_order(importance({"kind": "random", "seed": 4}), neuron_weights(ffn, 0))
    assert first == again and sorted(first) == list(range(48))
    assert first != other_layer and first != other_seed


def test_an_ordering_keeps_the_best_scores_and_breaks_ties_by_index() -> None:
    class Fixed(Importance):
        def __init__(self, values: list[float]) -> None:
            self.values = values

        @classmethod
        def kind_name(cls) -> str:
            return "fixed"

        def scores(self, ffn: NeuronWeights) -> torch.Tensor:
            return torch.tensor(self.values)

    view = NeuronWeights(0, (torch.zeros(4, 2),), torch.zeros(2, 4), None)
    assert neuron_order(Fixed([0.1, 0.5, 0.5, 0.2]), view) == [1, 2, 3, 0]
    assert kept_neurons([1, 2, 3, 0], 2) == [1, 2]
    with pytest.raises(PluginError, match=r"returned \(3,\).*shape \(4,\)"):
        neuron_order(Fixed([0.1, 0.5, 0.5]), view)
    with pytest.raises(PluginError, match="non-finite"):
        neuron_order(Fixed([0.1, float("nan"), 0.5, 0.2]), view)


# the contract kit for importance plugins, proven on the builtins and on broken ones


@pytest.mark.parametrize(
    ("kind", "per_neuron"), [("magnitude", True), ("activation", True), ("random", False)]
)
def test_the_builtin_importances_keep_their_contract(kind: str, per_neuron: bool) -> None:
    from geospec.registry.loading import get_registries
    from geospec.testing import check_importance

    check_importance(get_registries()["importance"].get(kind).cls, per_neuron=per_neuron)


class Broken(Importance):
    class Params(PluginParams):
        kind: Literal["broken"] = "broken"

    flaw = ""  # each subclass in the test below breaks one rule

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        flaw = type(self).flaw
        if flaw == "shape":
            return ffn.output.norm(dim=0)[:-1]
        if flaw == "nan":
            return ffn.output.norm(dim=0) * float("nan")
        if flaw == "integer":
            return ffn.output.norm(dim=0).long()
        if flaw == "unstable":
            return torch.rand(ffn.width)
        if flaw == "mutates":
            ffn.output.mul_(2)
            return ffn.output.norm(dim=0)
        if flaw == "positional":
            return torch.arange(ffn.width, dtype=torch.float32)
        return ffn.output.norm(dim=0)


@pytest.mark.parametrize(
    ("flaw", "rule"),
    [
        ("shape", "shape (width,)"),
        ("nan", "every score must be finite"),
        ("integer", "floating point"),
        ("unstable", "the same FFN must get the same scores"),
        ("mutates", "must not change the weights"),
        ("positional", "must move with it when the neurons are permuted"),
    ],
)
def test_a_broken_importance_fails_the_rule_it_breaks(flaw: str, rule: str) -> None:
    from geospec.testing import ContractError, check_importance

    flawed = type("Flawed", (Broken,), {"flaw": flaw})
    with pytest.raises(ContractError, match=re.escape(rule)):
        check_importance(flawed)
    check_importance(Broken)  # the same class without the flaw passes
