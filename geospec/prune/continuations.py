"""Greedy continuations of the fixed prompts (``prune.select``'s) by the unpruned model and by
each budget's recommended model, for the report's "What to ship" to print beside the
perplexities."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from geospec.prune.cut import cut_to
from geospec.prune.units import Unit

if TYPE_CHECKING:
    from torch import nn

    from geospec.measure.probe import FFNSite
    from geospec.prune.cut import Cut


#: New tokens per greedy continuation: a sentence, enough to tell "Paris" from "la la la".
CONTINUATION_TOKENS = 16


def recommended_continuations(
    model: nn.Module,
    sites: Sequence[FFNSite],
    record: Mapping[str, Any],
    prompts: Sequence[Sequence[int]],
    stop: int | None,
    kept_by: Callable[[Unit, Sequence[int]], Cut],
) -> dict[str, Any]:
    """Greedy continuations (token ids) of ``prompts`` by the unpruned model and, per keep
    fraction, by its recommended arm as calibration seed ``seeds[0]`` cut it (``kept_by``: a
    unit's :class:`Cut` at its widths): what the report's "What to ship" prints beside the
    perplexities."""
    import torch

    prune_seed = int(record["seeds"][0])
    found: dict[str, Any] = {"reference": greedy(model, prompts, stop), "seed": prune_seed}
    for budget in record["budgets"]:
        if "recommended" not in budget:
            continue
        name = budget["recommended"]["arm"]
        widths = budget["arms"][name]["widths"][str(prune_seed)]
        cut = kept_by(Unit(budget["keep"], name, prune_seed), widths)
        with torch.no_grad(), cut_to(sites, cut, widths):
            found[f"{budget['keep']:g}"] = greedy(model, prompts, stop)
    return found


def greedy(
    model: nn.Module, prompts: Sequence[Sequence[int]], stop: int | None = None
) -> list[list[int]]:
    """Each prompt's :data:`CONTINUATION_TOKENS` most likely next tokens, one at a time, up to
    and with ``stop`` (no KV cache: a few short prompts, and geospec's own model has none)."""
    import torch

    from geospec.measure.sensitivity import logits_of

    device = next(model.parameters()).device
    continued = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], device=device)
            for _ in range(CONTINUATION_TOKENS):
                following = logits_of(model, ids)[0, -1].argmax()
                ids = torch.cat([ids, following.view(1, 1)], dim=1)
                if int(following) == stop:
                    break
            continued.append([int(t) for t in ids[0, len(prompt) :]])
    return continued


def healed_continuations(
    before: nn.Module, after: nn.Module, tokenizer: Any, bos: int | None, stop: int | None
) -> dict[str, list[str]]:
    """``geospec heal``'s continuations: each fixed prompt continued greedily by the pruned
    model before healing and by the healed one, as text (what "heal it before use" was about:
    whether the healed model still answers "la la la")."""
    from geospec.prune.select import PROMPTS, prompt_ids

    prompts = prompt_ids(tokenizer, bos)

    def texts(model: nn.Module) -> list[str]:
        continued = greedy(model, prompts, stop)
        return [tokenizer.decode(ids, skip_special_tokens=True) for ids in continued]

    return {"prompts": list(PROMPTS), "before": texts(before), "after": texts(after)}
