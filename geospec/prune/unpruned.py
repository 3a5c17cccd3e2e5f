"""The unpruned model as a prune reads it before any unit is computed: its FFN sites and
pretrained width (checked to be FFNs geospec can cut), and its own losses on the eval and
selection windows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from geospec.measure.probe import FFNSite


def ffn_sites(
    model: nn.Module, d_model: int, corpora: Mapping[str, Sequence[Any]]
) -> tuple[list[FFNSite], int]:
    """The FFN of every decoder layer of ``model`` (found on the first eval window's first
    token), checked to be one geospec can cut, and the pretrained width."""
    from geospec.measure.cut import CutError, ffn_layout, ffn_width
    from geospec.measure.probe import find_ffn_sites
    from geospec.measure.sensitivity import logits_of

    first = next(iter(corpora.values()))[0][0][:1]
    sites = find_ffn_sites(model, d_model, lambda: logits_of(model, first))
    try:
        ffn_layout(sites[0].ffn)
    except CutError as error:
        raise CutError(f"prune: the FFN of {type(sites[0].layer).__name__}: {error}") from None
    return sites, ffn_width(sites[0].ffn)


def unpruned_losses(
    model: nn.Module,
    corpora: Mapping[str, Sequence[Any]],
    selection: Sequence[Any] | None,
    say: Callable[[str], None],
) -> tuple[dict[str, float], float | None]:
    """The unpruned model's loss on every eval corpus, and on the selection windows (None
    without them)."""
    import torch

    from geospec.prune.losses import eval_loss

    # each of these passes takes seconds to minutes on a CPU: a line says which runs
    selected = "" if selection is None else f" and {len(selection)} batches of selection windows"
    windows = sum(len(batches) for batches in corpora.values())
    say(f"prune: the unpruned model's loss on {windows} batches of eval windows{selected}")
    with torch.no_grad():
        reference = {name: eval_loss(model, batches) for name, batches in corpora.items()}
        reference_select = None if selection is None else eval_loss(model, selection)
    return reference, reference_select
