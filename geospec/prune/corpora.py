"""The held-out text a pruned model is scored on: each eval corpus's first validation windows,
tokenized like [data] (never calibration text: calibration draws from the training split)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from geospec.errors import UsageError
from geospec.spec.sections import DataSpec, PruneEval

if TYPE_CHECKING:
    from geospec.engine.token_data import TokenData


def eval_data(data: DataSpec, corpus: str) -> DataSpec:
    """The data section of one eval corpus: [data]'s tokenizer and split, another text."""
    if corpus.startswith("bundled:") or corpus == data.source:
        return data.model_copy(update={"source": corpus, "files": None, "max_documents": None})
    return data.model_copy(update={"source": None, "files": [corpus], "max_documents": None})


def eval_batches(
    settings: PruneEval,
    data: DataSpec,
    seq_len: int,
    token_data: Callable[[DataSpec], TokenData],
    device: Any,
) -> dict[str, list[Any]]:
    """Each eval corpus's first ``settings.windows`` validation windows, in batches on
    ``device``; ``token_data`` tokenizes a data section (the run's shared token cache)."""
    from geospec.measure.sensitivity import loss_batches, scored_text

    result = {}
    for corpus in settings.corpora:
        try:
            tokens_of = token_data(eval_data(data, corpus))
        except UsageError as error:
            raise UsageError(f"prune.eval.corpora: {corpus!r}: {error}") from None
        tokens = scored_text(tokens_of.val, tokens_of.eot_id if data.end_of_text else None)
        needed = settings.windows * seq_len + 1
        if len(tokens) < needed:
            raise UsageError(
                f"prune.eval.corpora: {corpus!r} has {len(tokens)} validation tokens, fewer "
                f"than {settings.windows} windows of {seq_len} need; lower "
                "prune.eval.windows or use a longer text"
            )
        result[corpus] = loss_batches(
            tokens, seq_len, settings.windows, settings.batch_size, device, tokens_of.bos_id
        )
    return result
