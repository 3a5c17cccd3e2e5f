"""What a (cut) model is measured by: its mean next-token loss on windows of text, each
window's (what a bootstrap resamples), and its FFN parameters."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from geospec.measure.probe import FFNSite
from geospec.measure.sensitivity import Batch, logits_of, mean_loss


def eval_loss(model: nn.Module, batches: Sequence[Batch]) -> float:
    """Mean next-token cross-entropy over ``batches`` (its exp is the perplexity)."""
    return mean_loss(model, batches)


def window_losses(model: nn.Module, batches: Sequence[Batch]) -> list[float]:
    """Each window's mean next-token cross-entropy, in the windows' order (every window scores
    as many tokens, so their mean is :func:`eval_loss`): what a bootstrap over the eval windows
    resamples."""
    import torch.nn.functional as F

    found: list[float] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for inputs, targets in batches:
                logits = logits_of(model, inputs)
                per_token = F.cross_entropy(
                    logits.flatten(0, 1).float(), targets.flatten(), reduction="none"
                )
                found.extend(per_token.double().view(targets.shape).mean(dim=1).tolist())
    finally:
        model.train(was_training)
    return found


def ffn_parameters(sites: Sequence[FFNSite]) -> int:
    """Parameters of every FFN as it is now (cut or not)."""
    return sum(p.numel() for site in sites for p in site.ffn.parameters())
