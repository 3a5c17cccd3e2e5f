"""Cutting FFN neurons (geospec.measure.cut) against its definition: a cut model computes what
the full model computes with those neurons' activations set to zero, on every family the probe
maps; and the builtin importance scores against their formulas."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Literal

import hf_models
import numpy as np
import pytest
import torch
from torch import nn

from geospec.engine.model import GPT, GPTConfig
from geospec.errors import PluginError
from geospec.kinds import ActivationStats, Importance, NeuronWeights
from geospec.measure.cut import (
    CutError,
    activation_stats,
    compensation_bias,
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
    "gemma3": lambda: (hf_models.gemma3(), hf_models.WIDTH),
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


@contextmanager
def replaced_by(ffn: nn.Module, removed: list[int], values: torch.Tensor) -> Iterator[None]:
    """Inside the block, a forward pre-hook on ``ffn``'s output projection overwrites the hidden
    activations of neurons ``removed`` with ``values[removed]`` (the reference a compensated cut
    must equal, written here independently of the cut)."""

    def overwrite(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
        hidden = args[0].clone()
        hidden[..., removed] = values[removed].to(hidden.dtype)
        return (hidden,)

    handle = getattr(ffn, ffn_layout(ffn).output).register_forward_pre_hook(overwrite)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_compensated_cut_equals_the_full_model_with_removed_activations_at_their_means(
    family: str,
) -> None:
    model, width = FAMILIES[family]()
    boost(model)
    ffns = ffns_of(model, width)
    with torch.no_grad(), activation_stats(ffns) as stats:
        logits_of(model, tokens(4))  # calibration text, not the text compared on
        means = [s.mean for s in stats()]
    ids = tokens(1)
    kept = [random_keep(ffn_width(f), ffn_width(f) // 2 + i, seed=i) for i, f in enumerate(ffns)]
    with torch.no_grad():
        expected_full = logits_of(model, ids)
        with ExitStack() as stack:
            for ffn, keep, mean in zip(ffns, kept, means, strict=True):
                removed = sorted(set(range(ffn_width(ffn))) - set(keep))
                stack.enter_context(replaced_by(ffn, removed, mean))
            reference = logits_of(model, ids)
        with ExitStack() as stack:
            for ffn, keep in zip(ffns, kept, strict=True):
                stack.enter_context(ffn_cut(ffn, keep))
            uncompensated = logits_of(model, ids)
        before = [{n: p for n, p in f.named_parameters()} for f in ffns]
        with ExitStack() as stack:
            for ffn, keep, mean in zip(ffns, kept, means, strict=True):
                stack.enter_context(ffn_cut(ffn, keep, compensate=mean))
                assert getattr(ffn, ffn_layout(ffn).output).bias is not None
            compensated = logits_of(model, ids)
        after = logits_of(model, ids)
    torch.testing.assert_close(compensated, reference, atol=5e-5, rtol=1e-5)
    assert (compensated - uncompensated).abs().max() > 1e-2  # the bias did something real
    # the block restored every module exactly: the same parameters, no bias gained
    assert torch.equal(after, expected_full)
    for ffn, parameters in zip(ffns, before, strict=True):
        now = dict(ffn.named_parameters())
        assert now.keys() == parameters.keys()
        assert all(now[name] is parameter for name, parameter in parameters.items())


def test_compensation_values_are_checked() -> None:
    ffn = hf_models.llama().model.layers[0].mlp
    with pytest.raises(CutError, match=r"shape \(80,\)"):
        cut_ffn(ffn, [0, 1], compensate=torch.zeros(79))
    with pytest.raises(CutError, match="finite"):
        cut_ffn(ffn, [0, 1], compensate=torch.full((80,), float("nan")))
    # nothing removed: nothing added
    assert not compensation_bias(ffn, list(range(80)), torch.ones(80)).any()
    assert ffn.down_proj.bias is None and ffn_width(ffn) == 80


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


def captured_hidden(ffn: nn.Module, run: Callable[[], object]) -> np.ndarray:
    """Every token's hidden activation (the output projection's input) of ``ffn`` during
    ``run``, as a tokens x width float64 array."""
    captured: list[torch.Tensor] = []
    output = getattr(ffn, ffn_layout(ffn).output)
    handle = output.register_forward_pre_hook(lambda m, a: captured.append(a[0].detach()))
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return np.concatenate([h.reshape(-1, h.shape[-1]).double().numpy() for h in captured])


@pytest.mark.parametrize("family", ["gpt2", "llama-gqa", "geospec-swiglu"])
def test_activation_statistics_are_means_over_every_calibration_token(family: str) -> None:
    model, width = FAMILIES[family]()
    ffns = ffns_of(model, width)
    ids = tokens(2)

    def run() -> None:
        logits_of(model, ids)
        logits_of(model, ids[:1])  # batches of 24 and 12 tokens: weighted by their counts

    with torch.no_grad(), activation_stats(ffns) as stats:
        run()
        measured = stats()
    for layer, ffn in enumerate(ffns):
        hidden = captured_hidden(ffn, run)
        assert hidden.shape[0] == 36
        got = measured[layer]
        assert got.mean.dtype == torch.float64
        np.testing.assert_allclose(got.mean.numpy(), hidden.mean(0), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(got.mean_abs.numpy(), np.abs(hidden).mean(0), rtol=1e-12)
        np.testing.assert_allclose(got.mean_square.numpy(), (hidden**2).mean(0), rtol=1e-12)
        # the population variance (ddof 0) and the RMS
        np.testing.assert_allclose(got.variance.numpy(), hidden.var(0), rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(got.rms.numpy(), np.sqrt((hidden**2).mean(0)), rtol=1e-12)
        view = neuron_weights(ffn, layer, stats=got)
        assert view.stats is not None and torch.equal(view.stats.mean, got.mean)
        torch.testing.assert_close(view.activation, got.mean_abs.float())
    with torch.no_grad(), hidden_activations(ffns) as means:  # the mean |a| alone, as before
        run()
        assert torch.equal(means()[1], measured[1].mean_abs)


def hand_ffn() -> NeuronWeights:
    """Three neurons seen on two tokens, a = [[1, 0, -2], [3, 0, 2]]: means 2, 0, 0; mean
    squares 5, 0, 4; variances 1, 0, 4; RMS sqrt 5, 0, 2. W_out (d_model 2 x 3) = [[1, 2, -1],
    [-3, 0, 1]]: squared column norms 10, 4, 2; mean |column| 2, 1, 1."""
    tokens = torch.tensor([[1.0, 0.0, -2.0], [3.0, 0.0, 2.0]], dtype=torch.float64)
    stats = ActivationStats(tokens.mean(0), tokens.abs().mean(0), tokens.square().mean(0))
    output = torch.tensor([[1.0, 2.0, -1.0], [-3.0, 0.0, 1.0]])
    return NeuronWeights(0, (torch.ones(3, 2),), output, stats.mean_abs.float(), stats)


def test_fluctuation_is_flaps_variance_times_the_squared_column_norm() -> None:
    scores = importance({"kind": "fluctuation"}).scores(hand_ffn())
    torch.testing.assert_close(scores.double(), torch.tensor([10.0, 0.0, 8.0]).double())


def test_wanda_sp_is_the_mean_absolute_column_times_the_rms_activation() -> None:
    scores = importance({"kind": "wanda_sp"}).scores(hand_ffn())
    torch.testing.assert_close(scores.double(), torch.tensor([2 * 5**0.5, 0.0, 2.0]).double())


def test_activation_is_the_mean_absolute_activation_times_the_column_norm() -> None:
    scores = importance({"kind": "activation"}).scores(hand_ffn())
    # mean |a| = 2, 0, 2; column norms sqrt 10, 2, sqrt 2
    expected = torch.tensor([2 * 10**0.5, 0.0, 2 * 2**0.5])
    torch.testing.assert_close(scores, expected)


@pytest.mark.parametrize("kind", ["fluctuation", "wanda_sp"])
def test_the_calibrated_scores_match_numpy_on_the_raw_activations(kind: str) -> None:
    model = hf_models.llama()
    ffns = ffns_of(model, hf_models.WIDTH)
    ids = tokens(3)
    with torch.no_grad(), activation_stats(ffns) as stats:
        logits_of(model, ids)
        measured = stats()
    hidden = captured_hidden(ffns[1], lambda: logits_of(model, ids))
    down = ffns[1].down_proj.weight.detach().double().numpy()  # d_model x width
    if kind == "fluctuation":
        expected = hidden.var(axis=0) * (down**2).sum(axis=0)
    else:
        expected = np.abs(down).mean(axis=0) * np.sqrt((hidden**2).mean(axis=0))
    scores = importance({"kind": kind}).scores(neuron_weights(ffns[1], 1, stats=measured[1]))
    np.testing.assert_allclose(scores.double().numpy(), expected, rtol=1e-5)
    with pytest.raises(PluginError, match=f"'{kind}' failed on layer 1.*statistics"):
        neuron_order(importance({"kind": kind}), neuron_weights(ffns[1], 1))


def flap_fluctuation(sequences: list[np.ndarray]) -> np.ndarray:
    """FLAP's own running estimate (BiasGPT.add_batch with metric WIFV, lib/layerwrapper.py of
    CASIA-IVA-Lab/FLAP), transcribed: one call per sequence of tokens x width activations, the
    in-place update of the baseline (so the "old" mean is the new one) included."""
    baseline = np.zeros(sequences[0].shape[1])
    fluctuation: np.ndarray | float = np.zeros_like(baseline)
    for n, sequence in enumerate(sequences):
        inp = sequence.T  # width x tokens
        baseline *= n / (n + 1)
        baseline += inp.mean(axis=1) / (n + 1)
        old = baseline  # FLAP's old_baseline_inp aliases the updated tensor
        if n == 0:
            fluctuation = 0.0
        else:
            fluctuation = fluctuation * (n - 1) / n
            fluctuation = fluctuation + ((inp - baseline[:, None]) * (inp - old[:, None])).sum(
                axis=1
            ) / (n + 1)
    assert isinstance(fluctuation, np.ndarray)
    return fluctuation


def test_fluctuation_orders_neurons_as_flaps_own_estimate_does() -> None:
    """FLAP's streaming estimate is T x the variance up to quirks that fade with the sample:
    on 48 sequences the two agree in ranking and in the neurons a half cut keeps, to a few."""
    from scipy.stats import spearmanr

    model = hf_models.llama()
    ffn = ffns_of(model, hf_models.WIDTH)[1]
    ids = torch.randint(0, VOCAB, (48, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), activation_stats([ffn]) as stats:
        logits_of(model, ids)
        measured = stats()[0]
    hidden = captured_hidden(ffn, lambda: [logits_of(model, ids[i : i + 1]) for i in range(48)])
    flap = flap_fluctuation([hidden[16 * i : 16 * (i + 1)] for i in range(48)])
    norms = (ffn.down_proj.weight.detach().double().numpy() ** 2).sum(axis=0)
    flap_scores = flap * norms  # lib/prune.py line 16
    ours = importance({"kind": "fluctuation"}).scores(neuron_weights(ffn, 1, stats=measured))
    assert spearmanr(ours.numpy(), flap_scores).statistic > 0.99
    half = set(np.argsort(-flap_scores)[:40].tolist())
    assert (
        len(
            half
            & set(
                neuron_order(
                    importance({"kind": "fluctuation"}), neuron_weights(ffn, 1, stats=measured)
                )[:40]
            )
        )
        >= 37
    )


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
    ("kind", "per_neuron"),
    [
        ("magnitude", True),
        ("activation", True),
        ("fluctuation", True),
        ("wanda_sp", True),
        ("random", False),
        ("obs", True),
    ],
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


def test_the_contract_kit_gives_statistics_and_catches_a_score_that_changes_them() -> None:
    from geospec.testing import ContractError, check_importance

    class Centred(Importance):
        """Reads the statistics: |mean| / RMS times the column norm."""

        needs_activations = True
        shift = False  # the flawed subclass below changes the statistics it is given

        class Params(PluginParams):
            kind: Literal["centred"] = "centred"

        def scores(self, ffn: NeuronWeights) -> torch.Tensor:
            assert ffn.stats is not None and ffn.activation is not None
            stats = ffn.stats
            # the kit's statistics are those of real tokens: E|a| >= |E a|, E a² >= (E|a|)²
            assert bool((stats.mean_abs >= stats.mean.abs()).all())
            assert bool((stats.mean_square >= stats.mean_abs**2 - 1e-12).all())
            torch.testing.assert_close(ffn.activation.double(), stats.mean_abs)
            if type(self).shift:
                stats.mean.add_(1.0)
            return stats.mean.abs() / stats.rms * ffn.output.norm(dim=0)

    check_importance(Centred)
    flawed = type("Flawed", (Centred,), {"shift": True})
    with pytest.raises(ContractError, match="must not change the weights"):
        check_importance(flawed)
