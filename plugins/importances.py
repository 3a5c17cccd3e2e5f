"""The builtin neuron importance scores (``importance`` plugins): which FFN neurons a cut keeps.

- ``magnitude``: |W_in row| x |W_out column| (for a gated FFN, the gate and up rows' norms
  multiplied): a weight-only score, no data needed.
- ``activation``: E_t|a_j| x ||W_out[:, j]||_2, the neuron's mean |activation| over the
  calibration tokens times its output column's L2 norm (an upper bound on the mean size of its
  contribution to the residual stream). It is neither Wanda-sp's score (mean |W| x RMS) nor
  FLAP's (variance x squared norm): those are ``wanda_sp`` and ``fluctuation``.
- ``fluctuation``: FLAP's WIFV metric, Var_t(a_j) x ||W_out[:, j]||_2^2.
- ``wanda_sp``: Wanda-sp's structured score, mean_i |W_out[i, j]| x RMS_t(a_j).
- ``random``: seeded scores, the control (a cut that knows nothing about the neurons).
- ``obs``: structured Optimal Brain Surgeon (ZipLM's): neurons removed greedily, each time the
  one whose removal, with the kept output weights re-fitted, costs the least output error; its
  score is the step at which it would go (the order the least-squares repair wants).

a_j is neuron j's hidden activation (the input of the output projection) on a calibration token
t, W_out the output (down) projection as d_model x width; the statistics come from
``NeuronWeights.stats`` (one pass of the unpruned model over the calibration windows).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from geospec import hookimpl
from geospec.kinds import ActivationStats, Importance, NeuronWeights
from geospec.plugin import PluginParams, Register

if TYPE_CHECKING:
    import torch


class Magnitude(Importance):
    """Norm of the neuron's input rows (multiplied over the gate and up projections) times the
    norm of its output column."""

    class Params(PluginParams):
        kind: Literal["magnitude"] = "magnitude"

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        score = ffn.output.norm(dim=0)
        for matrix in ffn.inputs:
            score = score * matrix.norm(dim=1)
        return score


class Activation(Importance):
    """Mean |hidden activation| over the calibration tokens times the output column's L2 norm,
    E_t|a_j| x ||W_out[:, j]||_2."""

    needs_activations = True

    class Params(PluginParams):
        kind: Literal["activation"] = "activation"

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        if ffn.activation is None:
            raise ValueError("the activation score needs calibration activations")
        return ffn.activation * ffn.output.norm(dim=0)


def _stats(ffn: NeuronWeights, name: str) -> ActivationStats:
    if ffn.stats is None:
        raise ValueError(f"the {name} score needs calibration statistics (NeuronWeights.stats)")
    return ffn.stats


class Fluctuation(Importance):
    """FLAP's fluctuation metric WIFV (An et al., 2024): the population variance of the neuron's
    activation over the calibration tokens times its output column's squared L2 norm,
    Var_t(a_j) x ||W_out[:, j]||_2^2 (high when removing the neuron, even with its mean put back
    by bias compensation, changes the output most).

    As FLAP computes it (CASIA-IVA-Lab/FLAP at 3bb57db): ``lib/prune.py`` line 16, ``'WIFV':
    fluc_inp * torch.sum(W.pow(2), dim=0)`` over the down projection (out x in: the squared
    column norm; the extra ``** 2`` of line 336 is for attention heads only, line 351 takes the
    MLP's metric as is); ``fluc_inp`` is ``BiasGPT.add_batch``'s running fluctuation,
    ``lib/layerwrapper.py`` lines 70-84: squared deviations from the running mean, summed over a
    sequence's tokens and averaged over sequences. For sequences of one length T that is T x the
    population variance over tokens, up to the estimator's streaming quirks (the first
    sequence's deviations are dropped, line 79; ``old_baseline_inp`` aliases the updated mean,
    lines 70-72), which fade as the calibration sample grows: FLAP's update transcribed and run
    on 16 sequences of 256 tokens gives 0.83-0.85 x T x the population variance (rank
    correlation 0.9998 with it), on 128 sequences 0.96-0.97 x. The factor T is the same for every
    neuron of every layer, so orderings and FLAP's per-layer standardised scores do not depend
    on it; here the variance is the exact population variance E[a²] - E[a]² over every
    calibration token.
    """

    needs_activations = True

    class Params(PluginParams):
        kind: Literal["fluctuation"] = "fluctuation"

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        variance = _stats(ffn, "fluctuation").variance
        return variance * ffn.output.double().square().sum(dim=0)


class WandaSP(Importance):
    """Wanda-sp's structured score (An et al., 2024, the structured Wanda baseline of FLAP's
    code): the mean over output rows of |W_out[i, j]| times the neuron's RMS activation,
    mean_i |W_out[i, j]| x RMS_t(a_j).

    As FLAP's ``prune_wanda_sp`` computes it (CASIA-IVA-Lab/FLAP at 3bb57db, ``lib/prune.py``
    lines 464 and 472): ``(|W| * sqrt(scaler_row)).mean(axis=0)`` over the down projection (out x
    in: the mean over output rows), ``scaler_row`` being ``WrappedGPT.add_batch``'s
    (``lib/layerwrapper.py`` lines 31-35) running mean over sequences of sum_t a_j², T x E[a_j²]
    for sequences of T tokens: a factor sqrt(T) common to every neuron, left out here. Where it
    differs: Wanda-sp scores layer l on the activations of the already pruned layers before it
    (``lib/prune.py`` lines 479-482); here, as in FLAP, every layer is scored on the unpruned
    model's activations.
    """

    needs_activations = True

    class Params(PluginParams):
        kind: Literal["wanda_sp"] = "wanda_sp"

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        rms = _stats(ffn, "wanda_sp").rms
        return ffn.output.double().abs().mean(dim=0) * rms


class Random(Importance):
    """Uniform random scores, drawn from a generator seeded by ``seed`` and the layer index (so
    every layer gets its own ordering, the same in every run)."""

    class Params(PluginParams):
        kind: Literal["random"] = "random"
        seed: int = Field(0, ge=0, le=2**31 - 1)
        """Seed of the orderings."""

    params: Params

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        import torch

        generator = torch.Generator().manual_seed(self.params.seed * 100_003 + ffn.layer)
        return torch.rand(ffn.width, generator=generator, dtype=torch.float64)


class StructuredOBS(Importance):
    """Structured OBS (ZipLM, Kurtic et al. 2023; SlimGPT's grouped removal): with
    H = E[z z^T] the second moments of z = [a; 1] (the hidden activations and a constant, the
    bias, which is never removed), damped by ``damping`` x mean(diag E[a a^T]) on the neurons,
    removing neuron j from the output projection W (d_model x width, kept columns re-fitted by
    least squares) costs ||W[:, j]||^2 / [H^-1]_jj. The neuron of least cost is removed, W
    updated (W -= W[:, j] [H^-1]_j: / [H^-1]_jj) and H^-1 downdated, ``group`` neurons at a time,
    until one is left. A neuron's score is the step it was removed at (the last one left scores
    highest): the kept set at every width is the greedy OBS one, in one ordering.

    As DarwinLM's ``fast_obc_struct.py`` scores and updates FFN columns, with the bias column
    of the least-squares repair (:mod:`geospec.prune.repair`) kept alive throughout, so its cost
    is the cost after that repair at the same damping (up to the damping's reference: here the
    whole layer's mean diagonal, there the kept neurons')."""

    needs_activations = True
    needs_second_moments = True

    class Params(PluginParams):
        kind: Literal["obs"] = "obs"
        damping: float = Field(0.01, ge=0.0, le=1e6)
        """lambda / mean(diag E[a a^T]), added to the neurons' diagonal of H."""
        group: int | None = Field(None, ge=1, le=1_000_000)
        """Neurons removed per step (their costs from the step's start; 1: exact greedy OBS);
        omit for width // 128 (at least 1): 128 steps per layer."""

    params: Params

    def scores(self, ffn: NeuronWeights) -> torch.Tensor:
        import torch

        second, stats = ffn.second_moment, _stats(ffn, "obs")
        if second is None:
            raise ValueError("the obs score needs second moments (NeuronWeights.second_moment)")
        width = ffn.width
        hessian = torch.empty(width + 1, width + 1, dtype=torch.float64)
        hessian[:width, :width] = second
        damp = self.params.damping * float(second.diagonal().mean())
        hessian[:width, :width].diagonal().add_(damp if damp > 0 else self.params.damping)
        hessian[:width, width] = hessian[width, :width] = stats.mean
        hessian[width, width] = 1.0
        # The inverse and the weights are kept over the alive neurons and the bias (last) only:
        # removing a group is the Schur complement of its block, so each step's downdate costs
        # the alive count squared rather than the whole width's (about a third of the work over
        # a layer, and 1/4 of the memory from half-way on).
        inverse = torch.cholesky_inverse(torch.linalg.cholesky(hessian))
        weight = torch.zeros(ffn.output.shape[0], width + 1, dtype=torch.float64)
        weight[:, :width] = ffn.output.double()
        group = self.params.group or max(1, width // 128)
        alive = torch.arange(width)  # the global index of each alive neuron, in order
        step = torch.zeros(width, dtype=torch.float64)
        removed = 0
        while removed < width - 1:
            count = len(alive)
            cost = weight[:, :count].square().sum(dim=0) / inverse.diagonal()[:count]
            take = min(group, count - 1)
            chosen = torch.argsort(cost, stable=True)[:take]
            kept = torch.ones(count + 1, dtype=torch.bool)
            kept[chosen] = False
            block = inverse[chosen][:, chosen]
            rows = inverse[chosen][:, kept]  # (take, alive after the step + 1)
            weight = weight[:, kept] - weight[:, chosen] @ torch.linalg.solve(block, rows)
            inverse = inverse[kept][:, kept] - rows.T @ torch.linalg.solve(block, rows)
            step[alive[chosen]] = torch.arange(removed, removed + take, dtype=torch.float64)
            alive = alive[kept[:count]]
            removed += take
        step[alive] = width - 1
        return step


@hookimpl
def geospec_register_importances(register: Register) -> None:
    for cls in (Magnitude, Activation, Fluctuation, WandaSP, Random, StructuredOBS):
        register(cls)
