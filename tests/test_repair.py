"""Repair (geospec.prune.repair): the kept output columns re-fitted by least squares, against
numpy's lstsq and scikit-learn's Ridge on activations each test captures itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import hf_models
import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from geospec.measure.cut import compensation_bias, ffn_cut, kept_neurons, output_matrix
from geospec.measure.probe import find_ffn_sites
from geospec.measure.sensitivity import logits_of
from geospec.prune.cut import pruned
from geospec.prune.repair import (
    Moments,
    Refit,
    calibration_moments,
    load_refits,
    one_pass_refits,
    refit,
    save_refits,
    sequential_refits,
)

FAMILIES: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": hf_models.llama,
    "gpt2": hf_models.gpt2,
    "gemma3": hf_models.gemma3,
}


def batches_of(seed: int, count: int = 3, rows: int = 4, length: int = 12) -> list[Any]:
    generator = torch.Generator().manual_seed(seed)
    found = []
    for _ in range(count):
        ids = torch.randint(0, hf_models.VOCAB, (rows, length + 1), generator=generator)
        found.append((ids[:, :-1], ids[:, 1:]))
    return found


def sites_of(model: torch.nn.Module, batches: list[Any]) -> list[Any]:
    return find_ffn_sites(model, hf_models.WIDTH, lambda: logits_of(model, batches[0][0][:1]))


def hidden_activations(model: torch.nn.Module, site: Any, batches: list[Any]) -> np.ndarray:
    """Every token's hidden activation of ``site``'s FFN (the output projection's input), as the
    test's own hook captures them: tokens x n, float64."""
    names = ("down_proj", "c_proj")
    output = next(getattr(site.ffn, n) for n in names if hasattr(site.ffn, n))
    captured: list[torch.Tensor] = []

    def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        captured.append(args[0].detach().reshape(-1, args[0].shape[-1]).double())

    handle = output.register_forward_pre_hook(hook)
    with torch.no_grad():
        for inputs, _ in batches:
            logits_of(model, inputs)
    handle.remove()
    return torch.cat(captured).numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_refit_is_the_least_squares_fit_of_the_unpruned_output(family: str) -> None:
    """Without damping, [W_K', c] is numpy's lstsq of W a on [a_K, 1] over the captured tokens:
    the best the kept neurons and a bias can do."""
    model = FAMILIES[family]()
    batches = batches_of(0, count=6)
    sites = sites_of(model, batches)
    moments = calibration_moments(model, sites, batches, torch.float64)
    site = sites[1]
    a = hidden_activations(model, site, batches)
    w = output_matrix(site.ffn).detach().double().numpy()
    keep = sorted(np.random.default_rng(1).choice(a.shape[1], a.shape[1] // 4, replace=False))
    design = np.hstack([a[:, keep], np.ones((len(a), 1))])
    solution, *_ = np.linalg.lstsq(design, a @ w.T, rcond=None)
    weight, bias = refit(output_matrix(site.ffn), moments[1], keep, damping=0.0)
    np.testing.assert_allclose(weight.numpy(), solution[:-1].T, atol=1e-7, rtol=1e-5)
    np.testing.assert_allclose(bias.numpy(), solution[-1], atol=1e-7, rtol=1e-5)
    assert moments[1].count == len(a)
    np.testing.assert_allclose(moments[1].second.numpy(), a.T @ a / len(a), rtol=1e-10)


def test_without_an_intercept_the_refit_is_the_fit_on_the_kept_activations_alone() -> None:
    """intercept = false (a family whose MLP carries no bias): numpy's lstsq of W a on a_K, no
    constant column, and no bias."""
    model = hf_models.mistral()
    batches = batches_of(7, count=6)
    sites = sites_of(model, batches)
    moments = calibration_moments(model, sites, batches, torch.float64)
    a = hidden_activations(model, sites[0], batches)
    w = output_matrix(sites[0].ffn).detach().double().numpy()
    keep = list(range(1, a.shape[1], 3))
    solution, *_ = np.linalg.lstsq(a[:, keep], a @ w.T, rcond=None)
    weight, bias = refit(output_matrix(sites[0].ffn), moments[0], keep, 0.0, intercept=False)
    assert bias is None
    np.testing.assert_allclose(weight.numpy(), solution.T, atol=1e-7, rtol=1e-5)
    orders = [list(range(48)) for _ in sites]
    refits = one_pass_refits(sites, moments, orders, [24] * 3, 0.01, intercept=False)
    with torch.no_grad(), pruned(sites, orders, [24] * 3, refits=refits):
        assert all(site.ffn.down_proj.bias is None for site in sites)  # nothing to export


def test_the_damped_refit_is_ridge_towards_the_original_weights() -> None:
    """With damping d, W_K' - W_K is scikit-learn's Ridge (intercept unpenalised, alpha = d x
    mean diag H_KK x tokens) of the cut's residual W a - W_K a_K on a_K."""
    model = hf_models.llama()
    batches = batches_of(1, count=4)
    sites = sites_of(model, batches)
    moments = calibration_moments(model, sites, batches, torch.float64)
    a = hidden_activations(model, sites[0], batches)
    w = output_matrix(sites[0].ffn).detach().double().numpy()
    keep = list(range(0, a.shape[1], 3))
    damping = 0.05
    lam = damping * float(np.mean(np.diag(a[:, keep].T @ a[:, keep] / len(a))))
    residual = a @ w.T - a[:, keep] @ w[:, keep].T
    ridge = Ridge(alpha=lam * len(a), fit_intercept=True, solver="cholesky", tol=1e-12)
    ridge.fit(a[:, keep], residual)
    weight, bias = refit(output_matrix(sites[0].ffn), moments[0], keep, damping)
    np.testing.assert_allclose(weight.numpy(), w[:, keep] + ridge.coef_, atol=1e-8, rtol=1e-5)
    np.testing.assert_allclose(bias.numpy(), ridge.intercept_, atol=1e-8, rtol=1e-5)


def test_mean_compensation_is_the_refit_with_every_kept_weight_frozen() -> None:
    """As the damping grows without bound the kept columns stay as they are and the intercept
    becomes FLAP's mean compensation, sum over removed j of mean_j W[:, j]."""
    model = hf_models.llama()
    batches = batches_of(2)
    sites = sites_of(model, batches)
    moments = calibration_moments(model, sites, batches, torch.float64)
    keep = list(range(0, 80, 2))
    weight, bias = refit(output_matrix(sites[2].ffn), moments[2], keep, damping=1e12)
    expected = compensation_bias(sites[2].ffn, keep, moments[2].mean)
    torch.testing.assert_close(bias, expected, atol=1e-9, rtol=1e-6)
    torch.testing.assert_close(
        weight, output_matrix(sites[2].ffn).detach().double()[:, keep], atol=1e-9, rtol=1e-6
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_a_repaired_cut_computes_the_refit_and_keeps_the_input_rows(family: str) -> None:
    """Inside pruned(..., refits=...), each FFN outputs W_K' a_K + c + b0 on its own inputs, its
    gate and up (or c_fc) rows are the original rows of the kept neurons, and afterwards the
    model is the one it was."""
    model = FAMILIES[family]()
    batches = batches_of(3)
    sites = sites_of(model, batches)
    moments = calibration_moments(model, sites, batches, torch.float64)
    full = len(moments[0].mean)
    orders = [list(torch.randperm(full, generator=torch.Generator().manual_seed(i)).tolist())
              for i in range(len(sites))]  # fmt: skip
    widths = [full // 2, full, full // 4][: len(sites)]
    refits = one_pass_refits(sites, moments, orders, widths, damping=0.01)
    assert refits[1] is None  # a layer kept whole is not changed
    with torch.no_grad():
        before = logits_of(model, batches[0][0])
        inputs = torch.randn(5, hf_models.WIDTH, generator=torch.Generator().manual_seed(9))
        ffn = sites[0].ffn
        keep = kept_neurons(orders[0], widths[0])
        with ffn_cut(ffn, list(range(full))):
            hidden = _hidden(ffn, inputs)
        found = refits[0]
        assert found is not None
        with pruned(sites, orders, widths, refits=refits):
            got = ffn(inputs)
            names = ("gate_proj", "up_proj", "c_fc")
            for name in [n for n in names if hasattr(ffn, n)]:
                assert getattr(ffn, name).weight.shape[0 if name != "c_fc" else 1] == len(keep)
        base = _output_bias(ffn)
        expected = hidden[:, keep].double() @ found.weight.double().T + found.bias + base
        torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits_of(model, batches[0][0]), before)


def _hidden(ffn: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    captured: list[torch.Tensor] = []
    names = ("down_proj", "c_proj")
    output = next(getattr(ffn, n) for n in names if hasattr(ffn, n))
    handle = output.register_forward_pre_hook(lambda m, args: captured.append(args[0]))
    ffn(inputs)
    handle.remove()
    return captured[0]


def _output_bias(ffn: torch.nn.Module) -> torch.Tensor:
    names = ("down_proj", "c_proj")
    output = next(getattr(ffn, n) for n in names if hasattr(ffn, n))
    bias = getattr(output, "bias", None)
    return torch.zeros(hf_models.WIDTH, dtype=torch.float64) if bias is None else bias.double()


@pytest.mark.parametrize("family", FAMILIES)
def test_sequential_and_one_pass_agree_at_the_first_cut_layer_and_differ_after(
    family: str,
) -> None:
    """The first cut layer sees the unpruned model's inputs either way; a later one sees the
    repaired earlier layers' outputs in the sequential scheme, which its own pass measures."""
    model = FAMILIES[family]()
    batches = batches_of(4)
    sites = sites_of(model, batches)
    moments = calibration_moments(model, sites, batches, torch.float64)
    full = len(moments[0].mean)
    orders = [list(range(full))[::-1] for _ in sites]
    widths = [full // 2] * len(sites)

    once = one_pass_refits(sites, moments, orders, widths, damping=0.01)
    walked = sequential_refits(model, sites, batches, orders, widths, 0.01)
    first, later = once[0], walked[0]
    assert first is not None and later is not None
    torch.testing.assert_close(first.weight, later.weight, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(first.bias, later.bias, atol=1e-6, rtol=1e-4)
    # the last layer by the sequential scheme: the least-squares fit on the cut model's inputs,
    # measured here by a pass of the model cut and repaired as the walk left it
    with torch.no_grad(), pruned(sites[:-1], orders[:-1], widths[:-1], refits=walked[:-1]):
        again = calibration_moments(model, sites[-1:], batches, torch.float64)[0]
    last = walked[-1]
    assert last is not None
    expected, bias = refit(output_matrix(sites[-1].ffn), again, kept_neurons(orders[-1],
                           widths[-1]), 0.01)  # fmt: skip
    torch.testing.assert_close(last.weight.double(), expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(last.bias, bias, atol=1e-6, rtol=1e-4)
    assert (last.bias - once[-1].bias).abs().max() > 1e-6  # type: ignore[union-attr]


def test_the_repair_lowers_the_loss_against_the_plain_and_mean_compensated_cut() -> None:
    """On the calibration text the re-fit is the optimum over its family, which holds the cut
    (W_K, c = 0) and the mean compensation: its FFN output error is the smallest of the three."""
    model = hf_models.llama()
    batches = batches_of(5, count=8)
    sites = sites_of(model, batches)
    moments = calibration_moments(model, sites, batches, torch.float64)
    site, keep = sites[0], list(range(0, 80, 3))
    a = hidden_activations(model, site, batches)
    w = output_matrix(site.ffn).detach().double().numpy()
    weight, bias = refit(output_matrix(site.ffn), moments[0], keep, damping=0.0)
    target = a @ w.T
    errors = {
        "cut": target - a[:, keep] @ w[:, keep].T,
        "mean": target - a[:, keep] @ w[:, keep].T
        - compensation_bias(site.ffn, keep, moments[0].mean).numpy(),
        "lstsq": target - a[:, keep] @ weight.numpy().T - bias.numpy(),
    }  # fmt: skip
    mse = {name: float(np.mean(e**2)) for name, e in errors.items()}
    assert mse["lstsq"] < mse["mean"] < mse["cut"], mse


def test_a_repair_record_reads_back_and_a_damaged_one_is_named(tmp_path: Path) -> None:
    refits: list[Refit | None] = [
        Refit(torch.randn(4, 3), torch.randn(4, dtype=torch.float64)),
        None,
        Refit(torch.randn(4, 2), torch.randn(4, dtype=torch.float64)),
    ]
    path = tmp_path / "repair.safetensors"
    assert load_refits(path, "k") == (None, None)
    save_refits(path, "k", refits)
    found, problem = load_refits(path, "k")
    assert problem is None and found is not None and found[1] is None
    for got, wrote in zip(found, refits, strict=True):
        if wrote is not None:
            assert got is not None
            assert torch.equal(got.weight, wrote.weight) and torch.equal(got.bias, wrote.bias)
    assert "another computation" in str(load_refits(path, "other")[1])
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # a weight's byte edited
    path.write_bytes(bytes(data))
    assert "changed after geospec wrote them" in str(load_refits(path, "k")[1])
    path.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    assert "cannot be read" in str(load_refits(path, "k")[1])


def test_moments_are_float64_means_over_every_token() -> None:
    model = hf_models.gpt2()
    batches = batches_of(6)
    sites = sites_of(model, batches)
    found: list[Moments] = calibration_moments(model, sites, batches, torch.float64)
    a = hidden_activations(model, sites[2], batches)
    assert found[2].second.dtype == torch.float64
    np.testing.assert_allclose(found[2].mean.numpy(), a.mean(axis=0), rtol=1e-10, atol=1e-12)


def test_obs_removes_at_every_step_the_neuron_a_brute_force_search_removes() -> None:
    """Structured OBS with one neuron per step, on a layer small enough to enumerate: each
    step removes the neuron whose removal leaves the least damped output error after the kept
    weights and the bias are re-fitted, that error computed by numpy for every candidate."""
    from geospec.kinds import ActivationStats, NeuronWeights
    from geospec.plugin import create_plugin

    rng = np.random.default_rng(0)
    width, d_model, tokens = 7, 5, 300
    a = rng.standard_normal((tokens, width)) ** 3 * rng.uniform(0.2, 2.0, width) + rng.normal(
        size=width
    )
    w = rng.standard_normal((d_model, width))
    damping = 0.05
    second, mean = a.T @ a / tokens, a.mean(axis=0)
    stats = ActivationStats(*(torch.from_numpy(v) for v in (mean, np.abs(a).mean(0),
                                                             (a**2).mean(0))))  # fmt: skip
    ffn = NeuronWeights(0, (torch.zeros(width, 3),), torch.from_numpy(w).float(), None, stats,
                        torch.from_numpy(second))  # fmt: skip
    obs = create_plugin("importance", {"kind": "obs", "damping": damping, "group": 1})
    steps = obs.scores(ffn).numpy()
    removal = list(np.argsort(steps))[:-1]  # the order neurons go in

    # the damped objective tr((W0 - W') Hd (W0 - W')^T) over z = [a; 1], W0 = [W, 0]
    hd = np.zeros((width + 1, width + 1))
    hd[:width, :width] = second + damping * np.mean(np.diag(second)) * np.eye(width)
    hd[:width, width] = hd[width, :width] = mean
    hd[width, width] = 1.0
    w0 = np.hstack([np.asarray(ffn.output, dtype=np.float64), np.zeros((d_model, 1))])

    def error(kept: list[int]) -> float:
        support = [*kept, width]
        fitted = w0 @ hd[:, support] @ np.linalg.inv(hd[np.ix_(support, support)])
        full = np.zeros_like(w0)
        full[:, support] = fitted
        diff = w0 - full
        return float(np.trace(diff @ hd @ diff.T))

    alive = list(range(width))
    for gone in removal:
        costs = {j: error([k for k in alive if k != j]) for j in alive}
        assert gone == min(costs, key=lambda j: costs[j]), (gone, costs)
        alive.remove(gone)
    # and with one neuron removed, greedy is the exhaustive optimum
    best = min(range(width), key=lambda j: error([k for k in range(width) if k != j]))
    assert removal[0] == best


def test_grouped_obs_keeps_sets_nearer_the_exhaustive_best_than_the_activation_score() -> None:
    """With groups (SlimGPT's speed-up) OBS is greedy and no longer exact, but what it keeps at
    half the width of layers with correlated neurons is nearer the exhaustive search's best set
    (the least-squares error after the re-fit, by numpy) than what the activation score
    keeps."""
    from itertools import combinations

    from geospec.kinds import ActivationStats, NeuronWeights
    from geospec.plugin import create_plugin

    rng = np.random.default_rng(1)
    width, gaps = 8, {"obs": [], "activation": []}
    for _ in range(5):
        a = rng.standard_normal((200, width)) * rng.uniform(0.2, 2.0, width)
        a = a @ rng.standard_normal((width, width)) * 0.5 + a  # correlated neurons
        w = rng.standard_normal((4, width))
        stats = ActivationStats(*(torch.from_numpy(v) for v in (a.mean(0), np.abs(a).mean(0),
                                                                 (a**2).mean(0))))  # fmt: skip
        ffn = NeuronWeights(0, (torch.zeros(width, 3),), torch.from_numpy(w).float(),
                            stats.mean_abs.float(), stats,
                            torch.from_numpy(a.T @ a / 200))  # fmt: skip

        def error(kept: tuple[int, ...], a: np.ndarray = a, ffn: NeuronWeights = ffn) -> float:
            design = np.hstack([a[:, list(kept)], np.ones((len(a), 1))])
            target = a @ np.asarray(ffn.output, dtype=np.float64).T
            fitted, *_ = np.linalg.lstsq(design, target, rcond=None)
            return float(np.mean((target - design @ fitted) ** 2))

        best = min(error(k) for k in combinations(range(width), width // 2))
        for kind, params in (("obs", {"damping": 0.0, "group": 2}), ("activation", {})):
            scores = create_plugin("importance", {"kind": kind, **params}).scores(ffn)
            kept = tuple(sorted(int(i) for i in torch.argsort(-scores)[: width // 2]))
            gaps[kind].append(error(kept) / best - 1)
    assert np.mean(gaps["obs"]) < np.mean(gaps["activation"]), gaps


def test_float32_products_accumulated_in_float64_are_the_float64_moments() -> None:
    """The default (each batch's a^T a formed in float32, summed over batches in float64) is
    float64's moments to float32's rounding of a batch's sum, and its re-fit the same."""
    model = hf_models.llama()
    batches = batches_of(8, count=4)
    sites = sites_of(model, batches)
    exact = calibration_moments(model, sites, batches, torch.float64)
    fast = calibration_moments(model, sites, batches)
    for one, other in zip(exact, fast, strict=True):
        torch.testing.assert_close(other.second, one.second, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(other.mean, one.mean, rtol=1e-5, atol=1e-7)
    keep = list(range(0, 80, 2))
    w, b = refit(output_matrix(sites[0].ffn), exact[0], keep, 0.01)
    w32, b32 = refit(output_matrix(sites[0].ffn), fast[0], keep, 0.01)
    torch.testing.assert_close(w32, w, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(b32, b, rtol=1e-4, atol=1e-6)
