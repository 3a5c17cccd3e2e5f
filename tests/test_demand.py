"""Measured demand (geospec.measure.demand): from the cut layer on against one full forward pass
per cut, on every family; and on a hand-built model whose demand is known in closed form."""

from __future__ import annotations

from typing import Literal

import hf_models
import pytest
import torch
from test_cut import FAMILIES
from torch import nn

from geospec import hookimpl
from geospec.kinds import Importance, NeuronWeights
from geospec.measure.cut import ffn_width, neuron_order, neuron_weights
from geospec.measure.demand import CutPlan, Demand, demand_full_passes, measure_demand
from geospec.measure.probe import FFNSite, find_ffn_sites
from geospec.measure.sensitivity import logits_of, sample_pairs
from geospec.plugin import PluginParams, Register, create_plugin
from geospec.testing import registered

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

VOCAB, SEQ = hf_models.VOCAB, 12
KEEP = (0.75, 0.5, 0.25)


def batches(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Three batches of unequal size (the last one short)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (7, SEQ + 1), generator=generator)
    return [(tokens[i : i + 3, :-1], tokens[i : i + 3, 1:]) for i in range(0, 7, 3)]


def sites_of(model: nn.Module, width: int) -> list[FFNSite]:
    return find_ffn_sites(model, width, lambda: logits_of(model, batches()[0][0][:1]))


def magnitude_plan(sites: list[FFNSite], keep: tuple[float, ...], pairs: int = 3) -> CutPlan:
    importance = create_plugin("importance", {"kind": "magnitude"})
    orders = [neuron_order(importance, neuron_weights(s.ffn, i)) for i, s in enumerate(sites)]
    return CutPlan.of(orders, keep, 4, sample_pairs(len(sites), pairs, seed=1), keep[1])


def numbers(demand: Demand) -> list[float]:
    return [
        demand.base,
        *(v for row in demand.increase for v in row),
        *(v for p in demand.pairs for v in (p.joint, p.singles)),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_from_the_cut_on_equals_full_forward_passes(family: str) -> None:
    model, width = FAMILIES[family]()
    sites = sites_of(model, width)
    plan = magnitude_plan(sites, KEEP)
    expected = demand_full_passes(model, sites, batches(), plan)
    counted: list[int] = []
    got = measure_demand(model, sites, batches(), plan, progress=counted.append)
    assert got.fallback is None
    assert numbers(got) == pytest.approx(numbers(expected), abs=1e-6, rel=0)
    assert min(abs(v) for row in expected.increase for v in row) > 1e-5  # meaningful tolerance
    assert sum(counted) == len(batches()) * (len(sites) * (len(KEEP) + 1) + len(plan.pairs))
    assert got.widths == tuple(ffn_width(s.ffn) for s in sites)  # every layer put back
    assert got.kept == tuple(tuple(round(f * w / 4) * 4 for f in KEEP) for w in got.widths)


# A hand-built model whose demand is a closed form


class Scale(nn.Module):
    """A norm as the probe recognises one (a leaf whose parameter is a vector of the width)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class ReluFFN(nn.Module):
    """geospec's FFN layout (``fc``, ``proj``, ``swiglu``) with a ReLU."""

    swiglu = False

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, hidden, bias=False)
        self.proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(torch.relu(self.fc(x)))
        return out


class Layer(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width, bias=False)
        nn.init.zeros_(self.attn.weight)
        self.norm = Scale(width)
        self.ffn = ReluFFN(width, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.ffn(self.norm(x))


class Ledger(nn.Module):
    """Each token's state is (1, 0): every neuron of every layer reads the first coordinate
    (activation 1) and writes -c to the second; the "loss" is the second coordinate. So cutting a
    neuron of contribution c raises the mean loss by exactly c, whatever else is cut."""

    def __init__(self, contributions: list[list[float]]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(2, len(c)) for c in contributions)
        with torch.no_grad():
            for layer, c in zip(self.layers, contributions, strict=True):
                layer.ffn.fc.weight.zero_()
                layer.ffn.fc.weight[:, 0] = 1.0
                layer.ffn.proj.weight.zero_()
                layer.ffn.proj.weight[1] = -torch.tensor(c, dtype=torch.float64)
        self.double()  # the best neurons' contributions are large: float32 would cancel badly

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = torch.zeros(*ids.shape, 2, dtype=torch.float64)
        x[..., 0] = 1.0
        for layer in self.layers:
            x = layer(x)
        return x


def ledger_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model(inputs)[..., 1].double().sum()


def power_law_contributions(width: int, lam: float, a: float) -> list[float]:
    """c_r for the r-th most important neuron (r = 1..W) such that removing all but the k best
    raises the loss by lam ((k / W)^-a - 1): c_r = lam (((r-1)/W)^-a - (r/W)^-a), r >= 2 (the
    best neuron is never cut; it gets twice the second's), in a shuffled neuron order."""
    c = [lam * (((r - 1) / width) ** -a - (r / width) ** -a) for r in range(2, width + 1)]
    c = [2 * c[0], *c]
    order = torch.randperm(width, generator=torch.Generator().manual_seed(width))
    return [c[int(i)] for i in torch.argsort(order)]


def test_a_model_whose_demand_is_known_in_closed_form() -> None:
    truth = [(0.02, 1.0), (0.005, 0.5), (0.04, 2.0)]
    width = 64
    model = Ledger([power_law_contributions(width, lam, a) for lam, a in truth]).eval()
    sites = find_ffn_sites(model, 2, lambda: model(torch.zeros(1, 3, dtype=torch.long)))
    keep = (0.75, 0.5, 0.25, 0.125)
    plan = magnitude_plan(sites, keep, pairs=3)  # magnitude = |fc row| |proj column| = c_r
    demand = measure_demand(model, sites, batches(), plan, loss=ledger_loss)
    assert demand.fallback is None
    for layer, (lam, a) in enumerate(truth):
        expected = [lam * (f**-a - 1) for f in keep]
        assert list(demand.increase[layer]) == pytest.approx(expected, rel=1e-6)
    # contributions add: every pair's joint increase is the sum of its singles
    for pair in demand.pairs:
        assert pair.joint == pytest.approx(pair.singles, rel=1e-6)
    assert demand.additivity_slope == pytest.approx(1.0, rel=1e-6)
    fits = [fit_of(demand, layer) for layer in range(3)]
    for (lam, a), fit in zip(truth, fits, strict=True):
        assert (fit.sensitivity, fit.exponent) == pytest.approx((lam, a), rel=1e-3)


def fit_of(demand: Demand, layer: int) -> object:
    from geospec.measure.demand_fit import fit_demand

    return fit_demand(demand.keep, demand.increase[layer])


class RememberingLayer(Layer):
    """Layers after the first add what the first layer saw, kept between passes (as
    value-residual transformers keep the first layer's values): state the suffix cannot
    reproduce when it starts after the first layer."""

    def __init__(self, width: int, hidden: int, index: int, shared: dict[str, torch.Tensor]):
        super().__init__(width, hidden)
        self.index, self.shared = index, shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index == 0:
            self.shared["first"] = x.detach().clone()
        else:
            x = x + self.shared["first"]
        return super().forward(x)


class Remembering(Ledger):
    def __init__(self, contributions: list[list[float]]) -> None:
        super().__init__(contributions)
        self.shared: dict[str, torch.Tensor] = {}
        layers = [RememberingLayer(2, len(c), i, self.shared) for i, c in enumerate(contributions)]
        for new, old in zip(layers, self.layers, strict=True):
            new.load_state_dict(old.state_dict())
        self.layers = nn.ModuleList(layers).double()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = torch.zeros(*ids.shape, 2, dtype=torch.float64)
        x[..., 0] = 1.0
        x[..., 1] = ids * torch.arange(ids.shape[-1]) * 1e-3  # token- and position-dependent
        for layer in self.layers:
            x = layer(x)
        return x


def test_a_model_the_suffix_cannot_reproduce_is_measured_with_full_passes() -> None:
    model = Remembering([[0.1, 0.2, 0.3, 0.4] * 4] * 3).eval()
    sites = find_ffn_sites(model, 2, lambda: model(torch.zeros(1, 3, dtype=torch.long)))
    plan = magnitude_plan(sites, (0.75, 0.5))
    demand = measure_demand(model, sites, batches(), plan, loss=ledger_loss)
    assert demand.fallback is not None and "previous pass" in demand.fallback
    expected = demand_full_passes(model, sites, batches(), plan, loss=ledger_loss)
    assert numbers(demand) == numbers(expected)


def test_pair_keep_must_be_measured() -> None:
    with pytest.raises(ValueError, match=r"pair_keep 0\.3"):
        CutPlan.of([[0, 1, 2, 3]], (0.75, 0.5), 1, [], 0.3)


class Smallest(Importance):
    """A third-party importance: the smallest magnitude first (the anti-control)."""

    class Params(PluginParams):
        kind: Literal["smallest"] = "smallest"

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        return -ffn.output.norm(dim=0) * ffn.inputs[0].norm(dim=1)


class Package:
    @hookimpl
    def geospec_register_importances(self, register: Register) -> None:
        register(Smallest)


def test_a_third_party_importance_orders_the_cuts() -> None:
    """An importance registered by another package through the hook: the least magnitude first
    (the anti-control). Cutting by it costs more than by magnitude on the closed-form model."""
    model = Ledger([power_law_contributions(32, 0.01, 1.0)]).eval()
    sites = find_ffn_sites(model, 2, lambda: model(torch.zeros(1, 3, dtype=torch.long)))
    with registered(Package(), name="smallest-first"):
        smallest = create_plugin("importance", {"kind": "smallest"})
        order = neuron_order(smallest, neuron_weights(sites[0].ffn, 0))
    best = magnitude_plan(sites, (0.75, 0.5), pairs=0).orders[0]
    assert order == list(reversed(best))
    worst_first = CutPlan.of([order], (0.75, 0.5), 4)
    best_first = CutPlan.of([best], (0.75, 0.5), 4)
    costly = measure_demand(model, sites, batches(), worst_first, loss=ledger_loss).increase[0]
    cheap = measure_demand(model, sites, batches(), best_first, loss=ledger_loss).increase[0]
    assert all(c > b for c, b in zip(costly, cheap, strict=True))
