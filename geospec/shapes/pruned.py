"""A pruned budget's shape: ``keep`` of a pretrained FFN width in whole multiples, the model
every pruning arm is solved for at it, and why a keep fraction is none (torch-free; what
``geospec validate`` and the prune stage both check, so it sits below the spec)."""

from __future__ import annotations

from geospec.errors import UsageError
from geospec.kinds import ModelDims


def pruned_width(keep: float, width: int, multiple: int) -> int:
    """The pruned uniform width: ``keep`` of the pretrained ``width``, in whole multiples (below
    one multiple when :func:`keep_problem` says so)."""
    return round(keep * width / multiple) * multiple


def keep_problem(keep: float, width: int, multiple: int) -> str | None:
    """Why ``keep`` of ``width`` neurons per layer is no pruning budget (one clause naming the
    fix), or None when it is one: what ``geospec validate`` and the prune stage both refuse."""
    if pruned_width(keep, width, multiple) >= multiple:
        return None
    return (
        f"{keep:g} of {width} neurons rounds below one multiple ({multiple}) per layer; raise "
        f"keep ({multiple / width:.3g} keeps one multiple) or lower model.multiple_of"
    )


def pruned_dims(
    n_layers: int, d_model: int, width: int, multiple: int, keep: float, activation: str
) -> ModelDims:
    """The model whose uniform width is ``keep`` of the pretrained ``width`` (in multiples),
    capped at the pretrained width."""
    problem = keep_problem(keep, width, multiple)
    if problem is not None:
        raise UsageError(f"prune.keep: {problem}")
    uniform = pruned_width(keep, width, multiple)
    return ModelDims(n_layers, d_model, min(uniform, width), multiple, activation, max_width=width)
