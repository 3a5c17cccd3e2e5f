"""Cutting an FFN: removing hidden neurons exactly, and choosing which ones go.

A hidden neuron i of an FFN is row i of every input projection (W_in; the gate and up
projections of a gated FFN) and column i of the output projection. Removing those rows and that
column gives a smaller FFN whose output equals the full FFN's with neuron i's activation set to
zero, on every input (the bias of the output projection stays). :func:`cut_ffn` does it in place,
:func:`ffn_cut` for the duration of a block (the demand measurement cuts each layer in turn and
puts it back).

With ``compensate`` (a value per neuron, FLAP's bias compensation with the neurons' calibration
means), the output projection also gains the bias sum over the removed neurons j of
``compensate[j] * W_out[:, j]``: the cut FFN then equals the full one with each removed neuron's
activation replaced by ``compensate[j]`` instead of zero. A projection without a bias gets one.

The layouts it knows, found by the FFN module's own attributes:

- geospec's ``FeedForward``: ``fc`` (d -> w, or d -> 2w for swiglu: the gate half then the up
  half) and ``proj`` (w -> d);
- gated Hugging Face MLPs, ``gate_proj``/``up_proj``/``down_proj`` linear layers: Llama, Mistral,
  Qwen2, Gemma 2, SmolLM2 and GGUF checkpoints that transformers loads as one of them;
- GPT-2's MLP, ``c_fc``/``c_proj`` ``Conv1D`` layers (weights stored transposed, in x out).

Anything else (a fused gate-up projection, a mixture of experts) is a :class:`CutError`: cutting
it by guesswork could remove half a neuron. Which neurons go is an ``importance`` plugin's
choice (:func:`neuron_order`): every layer's neurons sorted by decreasing score, stored once and
reused at every width.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from geospec.errors import GeospecError, PluginError
from geospec.kinds import ActivationStats, Importance, NeuronWeights


class CutError(GeospecError):
    """An FFN whose neurons geospec cannot remove exactly (an unknown layout), or a cut that
    cannot be made (no neuron left, an index out of range)."""

    exit_code = 2


#: The gated Hugging Face MLPs: names of the gate, up and down projections.
GATED = ("gate_proj", "up_proj", "down_proj")
#: GPT-2's MLP: the input and output Conv1D.
GPT2 = ("c_fc", "c_proj")


@dataclass(frozen=True)
class FFNLayout:
    """Which child modules of an FFN hold its neurons: ``inputs`` and ``output`` are attribute
    names; ``fused`` is geospec's swiglu, whose ``fc`` holds the gate then the up projection;
    ``transposed`` is GPT-2's Conv1D (weight in x out)."""

    inputs: tuple[str, ...]
    output: str
    fused: bool = False
    transposed: bool = False


def ffn_layout(ffn: nn.Module) -> FFNLayout:
    """The layout of ``ffn`` (see the module docstring), or :class:`CutError` naming it."""
    children = dict(ffn.named_children())
    if {"fc", "proj"} <= children.keys() and hasattr(ffn, "swiglu"):
        return FFNLayout(("fc",), "proj", fused=bool(ffn.swiglu))
    if set(GATED) <= children.keys() and all(_is_linear(children[n]) for n in GATED):
        return FFNLayout(GATED[:2], GATED[2])
    if set(GPT2) <= children.keys() and all(hasattr(children[n], "nf") for n in GPT2):
        return FFNLayout(GPT2[:1], GPT2[1], transposed=True)
    names = ", ".join(f"{name} ({type(m).__name__})" for name, m in children.items())
    raise CutError(
        f"cannot cut the neurons of {type(ffn).__name__} (children: {names or 'none'}): geospec "
        "cuts geospec's own FFN, gated MLPs with gate_proj/up_proj/down_proj (Llama, Mistral, "
        "Qwen2, Gemma 2) and GPT-2's c_fc/c_proj"
    )


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear)


def ffn_width(ffn: nn.Module) -> int:
    """The number of hidden neurons of ``ffn``."""
    return int(output_matrix(ffn).shape[1])


def output_matrix(ffn: nn.Module) -> torch.Tensor:
    """The FFN's output projection as d_model x width (GPT-2's Conv1D stores it transposed)."""
    layout = ffn_layout(ffn)
    weight = _weight(getattr(ffn, layout.output))
    return weight.t() if layout.transposed else weight


def _weight(module: nn.Module) -> torch.Tensor:
    weight = module.weight
    assert isinstance(weight, torch.Tensor), f"{type(module).__name__} has no weight tensor"
    return weight


def _bias(module: nn.Module) -> torch.Tensor | None:
    bias = getattr(module, "bias", None)
    return bias if isinstance(bias, torch.Tensor) else None


def neuron_weights(
    ffn: nn.Module,
    layer: int,
    activation: torch.Tensor | None = None,
    stats: ActivationStats | None = None,
    second_moment: torch.Tensor | None = None,
) -> NeuronWeights:
    """What an importance score sees of ``ffn`` (float32 copies on the CPU, one row per neuron
    in every input matrix, one column per neuron in the output matrix), with its calibration
    ``stats`` (float64 copies; ``activation`` defaults to their mean |a|) and ``second_moment``
    (E[a a^T], a float64 copy)."""
    layout = ffn_layout(ffn)
    width = ffn_width(ffn)
    if stats is not None:
        if stats.width != width:
            raise CutError(f"layer {layer}: statistics of {stats.width} neurons for {width}")
        if activation is None:
            activation = stats.mean_abs
        stats = ActivationStats(
            *(t.detach().to("cpu", torch.float64).clone() for t in _fields(stats))
        )

    def matrix(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to("cpu", torch.float32).clone()

    inputs: list[torch.Tensor] = []
    for name in layout.inputs:
        weight = _weight(getattr(ffn, name))
        rows = weight.t() if layout.transposed else weight
        inputs += list(rows.split(width)) if layout.fused else [rows]
    output = output_matrix(ffn)
    if second_moment is not None:
        if tuple(second_moment.shape) != (width, width):
            raise CutError(f"layer {layer}: second moments of shape "
                           f"{tuple(second_moment.shape)} for {width} neurons")  # fmt: skip
        second_moment = second_moment.detach().to("cpu", torch.float64).clone()
    return NeuronWeights(
        layer,
        tuple(matrix(w) for w in inputs),
        matrix(output),
        None if activation is None else matrix(activation),
        stats,
        second_moment,
    )


def _fields(stats: ActivationStats) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return stats.mean, stats.mean_abs, stats.mean_square


def _kept_index(keep: Sequence[int] | torch.Tensor, width: int) -> torch.Tensor:
    index = torch.as_tensor(keep, dtype=torch.long).flatten()
    if index.numel() == 0:
        raise CutError("a cut must keep at least one neuron")
    if int(index.min()) < 0 or int(index.max()) >= width:
        raise CutError(f"neuron indices must lie in [0, {width}), got {index.min()}..{index.max()}")
    if len(torch.unique(index)) != len(index):
        raise CutError("neuron indices to keep must be distinct")
    return index.sort().values


def _sliced(
    module: nn.Module,
    rows: torch.Tensor,
    side: str,
    transposed: bool,
    extra_bias: torch.Tensor | None = None,
    replacement: torch.Tensor | None = None,
) -> nn.Module:
    """A copy of a Linear (or Conv1D) keeping output ``rows`` (side "out") or input ``rows``
    (side "in") of its weight; the bias follows the output side, plus ``extra_bias`` (float64,
    one value per output; a Linear without a bias gets one). ``replacement`` (out x kept, as a
    repair re-fits the kept input columns) takes the place of the kept part of the weight."""
    weight, bias = _weight(module), _bias(module)
    rows = rows.to(weight.device)
    # Linear: weight is out x in; Conv1D: in x out
    out_dim = 1 if transposed else 0
    dim = out_dim if side == "out" else 1 - out_dim
    if replacement is None:
        new_weight = weight.detach().index_select(dim, rows).clone()
    else:
        placed = replacement.detach().to(weight.device, weight.dtype)
        expected = (weight.shape[out_dim], len(rows))
        if tuple(placed.shape) != expected:
            raise CutError(f"a re-fitted output projection of shape {expected} is needed, got "
                           f"{tuple(placed.shape)}")  # fmt: skip
        new_weight = (placed.t() if transposed else placed).contiguous().clone()
    new_bias = None
    if bias is not None:
        new_bias = bias.detach().index_select(0, rows).clone() if side == "out" else bias.detach()
    if extra_bias is not None:
        # summed in float64, rounded once to the weight's dtype
        base = extra_bias.to(weight.device, torch.float64)
        new_bias = (base if new_bias is None else new_bias.to(torch.float64) + base).to(
            weight.dtype
        )
    if transposed:  # transformers' Conv1D(nf, nx): nf outputs, nx inputs
        copy = type(module)(new_weight.shape[1], new_weight.shape[0])
    else:
        copy = nn.Linear(
            new_weight.shape[1], new_weight.shape[0], bias=new_bias is not None, device="meta"
        )
    copy.weight = nn.Parameter(new_weight, requires_grad=weight.requires_grad)
    if new_bias is not None:
        copy.bias = nn.Parameter(new_bias.clone(), requires_grad=weight.requires_grad)
    return copy


def cut_modules(
    ffn: nn.Module,
    keep: Sequence[int] | torch.Tensor,
    compensate: torch.Tensor | None = None,
    refit: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> dict[str, nn.Module]:
    """The FFN's projections with only the neurons ``keep`` (indices, any order): attribute
    name -> new module. With ``compensate`` (one value per neuron of the full FFN), the output
    projection's bias gains the removed neurons' ``compensate[j] * W_out[:, j]`` (the module
    docstring). With ``refit`` (:class:`geospec.prune.repair.Refit`: the kept columns of the
    output projection re-fitted, d_model x kept in index order, and the bias it gains or None),
    those replace the kept columns and the bias is added; the input projections keep their rows as
    they are. The FFN itself is not changed."""
    layout = ffn_layout(ffn)
    width = ffn_width(ffn)
    index = _kept_index(keep, width)
    if compensate is not None and refit is not None:
        raise CutError("a cut is either mean-compensated or re-fitted, not both")
    replaced: dict[str, nn.Module] = {}
    for name in layout.inputs:
        rows = torch.cat([index, index + width]) if layout.fused else index
        replaced[name] = _sliced(getattr(ffn, name), rows, "out", layout.transposed)
    output = getattr(ffn, layout.output)
    extra = None if compensate is None else compensation_bias(ffn, index, compensate)
    columns = None
    if refit is not None:
        columns, extra = refit
    replaced[layout.output] = _sliced(output, index, "in", layout.transposed, extra, columns)
    return replaced


def compensation_bias(
    ffn: nn.Module, keep: Sequence[int] | torch.Tensor, compensate: torch.Tensor
) -> torch.Tensor:
    """The bias a cut keeping ``keep`` adds to the output projection with ``compensate``: the
    sum over the removed neurons j of ``compensate[j] * W_out[:, j]`` (float64, (d_model,))."""
    width = ffn_width(ffn)
    values = torch.as_tensor(compensate).detach()
    if tuple(values.shape) != (width,):
        raise CutError(
            f"compensation needs one value per neuron, shape ({width},); got {tuple(values.shape)}"
        )
    if not bool(torch.isfinite(values).all()):
        raise CutError("compensation values must be finite")
    removed = torch.ones(width, dtype=torch.bool)
    removed[_kept_index(keep, width)] = False
    matrix = output_matrix(ffn).detach()
    removed = removed.to(matrix.device)
    columns = matrix[:, removed].to(torch.float64)
    return columns @ values.to(matrix.device, torch.float64)[removed]


def cut_ffn(
    ffn: nn.Module, keep: Sequence[int] | torch.Tensor, compensate: torch.Tensor | None = None
) -> None:
    """Remove every hidden neuron of ``ffn`` not in ``keep``, in place (the kept neurons stay in
    their original order), compensated by ``compensate`` when given (:func:`cut_modules`)."""
    _install(ffn, cut_modules(ffn, keep, compensate), len(torch.as_tensor(keep).flatten()))


def _install(ffn: nn.Module, modules: dict[str, nn.Module], width: int | None) -> None:
    for name, module in modules.items():
        setattr(ffn, name, module)
    if width is not None and isinstance(getattr(ffn, "width", None), int):
        setattr(ffn, "width", width)  # noqa: B010  (geospec's FeedForward records its width)


@contextmanager
def ffn_cut(
    ffn: nn.Module,
    keep: Sequence[int] | torch.Tensor,
    compensate: torch.Tensor | None = None,
    refit: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> Iterator[None]:
    """Inside the block, ``ffn`` keeps only the neurons ``keep`` (compensated by ``compensate``,
    or its output projection re-fitted by ``refit``, when given: :func:`cut_modules`);
    afterwards it is the module it was (the same parameter objects, the bias it had or none)."""
    with ffn_replaced(
        ffn, cut_modules(ffn, keep, compensate, refit), len(torch.as_tensor(keep).flatten())
    ):
        yield


@contextmanager
def ffn_replaced(ffn: nn.Module, modules: dict[str, nn.Module], width: int) -> Iterator[None]:
    """Inside the block, ``ffn``'s projections are ``modules`` (:func:`cut_modules`'s, which a
    caller cutting the same layer to the same width many times may build once), ``width``
    neurons wide; afterwards it is the module it was (the same parameter objects)."""
    original = {name: getattr(ffn, name) for name in modules}
    before = getattr(ffn, "width", None)
    try:
        _install(ffn, modules, width)
        yield
    finally:
        _install(ffn, original, before)
        # under autocast (a compute dtype) torch keeps a cast copy of every weight it has cast
        # until the outermost autocast block ends; the cut's weights are gone now, and a prune
        # cuts hundreds of times in one block: their copies must not pile up
        torch.clear_autocast_cache()


@contextmanager
def zeroed_neurons(ffn: nn.Module, zero: Sequence[int] | torch.Tensor) -> Iterator[None]:
    """Inside the block, the activations of neurons ``zero`` are set to 0 where they enter the
    output projection: what a cut must equal (the tests' reference)."""
    layout = ffn_layout(ffn)
    index = torch.as_tensor(zero, dtype=torch.long)

    def zeroing(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0].clone()
        hidden[..., index.to(hidden.device)] = 0
        return (hidden, *args[1:])

    handle = getattr(ffn, layout.output).register_forward_pre_hook(zeroing)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def activation_stats(
    ffns: Sequence[nn.Module],
) -> Iterator[Callable[[], list[ActivationStats]]]:
    """Inside the block, accumulate every FFN's hidden activations a (the input of its output
    projection) over all tokens run: the sums of a, |a| and a² per neuron in float64; the yielded
    function returns their means over every token (one :class:`ActivationStats` per FFN, on the
    CPU)."""
    sums: list[torch.Tensor | None] = [None] * len(ffns)  # (3, width): a, |a|, a²
    counts = [0] * len(ffns)

    def hook(i: int) -> Callable[..., None]:
        def accumulate(module: nn.Module, args: tuple[Any, ...]) -> None:
            hidden = args[0].detach()
            flat = hidden.reshape(-1, hidden.shape[-1]).to(torch.float64)
            total = torch.stack(
                [flat.sum(dim=0), flat.abs().sum(dim=0), flat.square().sum(dim=0)]
            ).cpu()
            previous = sums[i]
            sums[i] = total if previous is None else previous + total
            counts[i] += flat.shape[0]

        return accumulate

    handles = []
    for i, ffn in enumerate(ffns):
        layout = ffn_layout(ffn)
        handles.append(getattr(ffn, layout.output).register_forward_pre_hook(hook(i)))

    def means() -> list[ActivationStats]:
        result = []
        for i, total in enumerate(sums):
            if total is None:
                raise CutError(f"FFN {i} was not called: no activations to average")
            mean, mean_abs, mean_square = total / counts[i]
            result.append(ActivationStats(mean, mean_abs, mean_square))
        return result

    try:
        yield means
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def hidden_activations(
    ffns: Sequence[nn.Module],
) -> Iterator[Callable[[], list[torch.Tensor]]]:
    """Inside the block, accumulate every FFN's mean absolute hidden activation (the input of its
    output projection) over all tokens run; the yielded function returns them (float64, one
    (width,) tensor per FFN). The mean |a| of :func:`activation_stats`."""
    with activation_stats(ffns) as stats:
        yield lambda: [s.mean_abs for s in stats()]


def neuron_order(importance: Importance, ffn: NeuronWeights) -> list[int]:
    """Every neuron of one FFN from the most to the least important by ``importance``'s scores
    (ties: the lower index first). A score of the wrong shape, or not finite, is a
    :class:`PluginError` naming the plugin."""
    return order_of(checked_scores(importance, ffn))


def order_of(scores: torch.Tensor) -> list[int]:
    """Neuron indices by decreasing score (ties: the lower index first)."""
    return [int(i) for i in torch.argsort(-scores, stable=True)]


def checked_scores(importance: Importance, ffn: NeuronWeights) -> torch.Tensor:
    """``importance``'s scores of one FFN as float64 on the CPU, checked: one finite score per
    neuron, or a :class:`PluginError` naming the plugin."""
    name = importance.kind_name()
    try:
        scores = importance.scores(ffn)
    except GeospecError:
        raise
    except Exception as error:
        raise PluginError(
            f"importance {name!r} failed on layer {ffn.layer}: {type(error).__name__}: {error}"
        ) from error
    if not isinstance(scores, torch.Tensor) or tuple(scores.shape) != (ffn.width,):
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise PluginError(
            f"importance {name!r} returned {shape} for layer {ffn.layer}; it must return a "
            f"tensor of shape ({ffn.width},), one score per neuron"
        )
    scores = scores.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(scores).all()):
        raise PluginError(
            f"importance {name!r} returned non-finite scores (NaN or inf) for layer {ffn.layer}"
        )
    return scores


def kept_neurons(order: Sequence[int], count: int) -> list[int]:
    """The ``count`` most important neurons of an ordering, in index order."""
    return sorted(order[:count])


def kept_width(width: int, fraction: float, multiple: int) -> int:
    """round(fraction x width) to the nearest multiple of ``multiple`` (at most ``width``), or a
    :class:`CutError` when that is below one multiple."""
    count = round(fraction * width / multiple) * multiple
    if count < multiple:
        raise CutError(
            f"keep fraction {fraction:g} of {width} neurons rounds to {count}, below one "
            f"multiple ({multiple}); raise the fraction or lower model.multiple_of"
        )
    return min(count, width)
