"""What to ship: per keep fraction, the arm with the lowest loss on held-out windows of the
calibration corpus (``prune.select``; docs/prune.md, "What to ship"), chosen without eval text.

The selection windows are the last ``prune.select.windows`` windows of [data]'s validation split.
Every width-setting stage of a prune reads the training split (the probe's, diagnose's and
demand's ``calibration_split`` is "train" wherever ``select`` is set: a spec check), and the eval
reads each corpus's first windows, so these windows decide nothing else and no eval window is
among them; where [data]'s corpus is also an eval corpus the two sets of windows are checked
apart. Changing the eval corpora changes no recommendation (tested). Torch-free but for
:func:`select_batches`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from geospec.errors import UsageError
from geospec.spec.sections import DataSpec, PruneSelect, PruneSpec

if TYPE_CHECKING:
    from geospec.engine.token_data import TokenData


def select_batches(
    prune: PruneSpec,
    data: DataSpec,
    seq_len: int,
    token_data: Callable[[DataSpec], TokenData],
    device: Any,
) -> list[Any]:
    """The selection windows in batches on ``device`` (one line, exit 2, where [data]'s
    validation split cannot hold them apart from the eval's first windows)."""
    from geospec.measure.sensitivity import loss_batches, scored_text
    from geospec.prune.corpora import eval_data

    assert prune.select is not None
    found = token_data(data)
    tokens = scored_text(found.val, found.eot_id if data.end_of_text else None)
    windows = prune.select.windows
    # an eval corpus that is [data]'s own text reads the first windows of these same tokens
    shared = [
        corpus
        for corpus in prune.eval.corpora
        if _same_text(token_data, eval_data(data, corpus), found)
    ]
    before = prune.eval.windows if shared else 0
    needed = (before + windows) * seq_len + 1
    if len(tokens) < needed:
        apart = f" after the {before} eval windows of {shared[0]!r}" if shared else ""
        raise UsageError(
            f"prune.select.windows: [data]'s validation split has {len(tokens)} tokens; "
            f"{windows} selection windows of {seq_len}{apart} need {needed}; lower "
            "prune.select.windows (or prune.eval.windows) or use a longer corpus"
        )
    tail = tokens[len(tokens) - (windows * seq_len + 1) :]
    return loss_batches(tail, seq_len, windows, prune.calibration.batch_size, device, found.bos_id)


def _same_text(
    token_data: Callable[[DataSpec], TokenData], other: DataSpec, found: TokenData
) -> bool:
    import numpy as np

    try:
        tokens = token_data(other).val
    except UsageError:  # an eval corpus that cannot be read is said where the eval reads it
        return False
    return len(tokens) == len(found.val) and bool(np.array_equal(tokens, found.val))


def key_select(select: PruneSelect | None) -> PruneSelect | None:
    """``prune.select`` as the prune stage's key holds it: whether the recommended models are
    timed (``runtime``) and whether they are chosen on their GGUF files (``shipped``) change
    prune.json, not what a unit computes, so neither is in it (at the values that kept older
    prunes' keys)."""
    return select and select.model_copy(update={"runtime": True, "shipped": False})


def recommend(
    arms: Mapping[str, Mapping[str, Any]], windows: int, losses: str = "select_loss"
) -> dict[str, Any]:
    """The recommended arm of one budget from its arms' ``losses`` (``select_loss``: per
    calibration seed, each selection window's loss; ``shipped_select_loss``: the same of each
    unit's GGUF file, prune.select.shipped): the lowest mean over seeds and windows (equal
    means, as of two arms with the same widths: the first name), with its margin over the next
    arm (the paired difference over seeds x windows, its 95% bootstrap interval) and every arm's
    mean."""
    from geospec.stats import crossed_bootstrap

    means = {
        name: _mean([v for values in arm[losses].values() for v in values])
        for name, arm in arms.items()
    }
    ranked = sorted(means, key=lambda name: (means[name], name))
    best, runner_up = ranked[0], ranked[1]
    ours, theirs = arms[best][losses], arms[runner_up][losses]
    table = [
        [b - a for a, b in zip(ours[seed], theirs[seed], strict=True)] for seed in sorted(ours)
    ]
    margin = crossed_bootstrap(table)
    return {
        "arm": best,
        "next": runner_up,
        "margin": margin.mean,
        "margin_ci": list(margin.ci),
        "windows": windows,
        "seeds": len(ours),
        "loss": {name: means[name] for name in ranked},
    }


#: What the recommended models continue greedily in "What to ship": a fact, code and prose, so
#: that a reader sees what a perplexity means (SmolLM2 cut to half its FFN neurons unhealed
#: answers the first with "la la la"). Fixed text, read by no decision.
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time,")


def prompt_ids(tokenizer: Any, bos: int | None) -> list[list[int]]:
    """:data:`PROMPTS` as token ids, after the tokenizer's BOS where it has one (as every
    scored window starts)."""
    start = [] if bos is None else [bos]
    return [start + tokenizer.encode(text, add_special_tokens=False).ids for text in PROMPTS]


def continuation_texts(found: Mapping[str, Any], tokenizer: Any) -> dict[str, Any]:
    """prune.json's ``continuations``: the prompts, and each model's continuations as text
    (``reference``: the unpruned model; a keep fraction: its recommended arm, cut as calibration
    seed ``seed`` cut it)."""
    texts: dict[str, Any] = {"prompts": list(PROMPTS), "seed": found["seed"]}
    for model, continued in found.items():
        if model != "seed":
            texts[model] = [tokenizer.decode(ids, skip_special_tokens=True) for ids in continued]
    return texts


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
