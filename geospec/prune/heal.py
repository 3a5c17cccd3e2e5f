"""Healing a pruned model: it is imported into geospec's engine (Llama-family checkpoints),
fine-tuned on the spec's training text like any training run (claimed, resumable, a failure
recorded in its directory: :func:`geospec.pipeline.training.train_into`, which the prune stage
hands in as ``train``), and scored again on every eval corpus."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.errors import UsageError
from geospec.spec.sections import PruneHeal, TrainSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from geospec.engine.distill import Teacher
    from geospec.engine.model import GPT, GPTConfig
    from geospec.prune.units import Unit

#: Trains ``config`` from ``initial`` into a directory under ``key``, with these settings and
#: seed; returns whether it finished (False: another process holds the directory).
Trainer = Callable[["GPTConfig", "dict[str, torch.Tensor]", TrainSpec, Path, str, int], bool]

#: Heals one unit's pruned model (imported into geospec's engine) in the given directory under
#: the unit's key and returns its loss on every eval corpus (what the prune stage hands a prune:
#: :func:`geospec.pipeline.healing.healer`).
Healer = Callable[["Unit", Path, str, "GPT"], dict[str, float]]


def check_healable(model: nn.Module, heal: PruneHeal) -> None:
    """One line, before any unit is computed, when ``heal`` asks for healing a checkpoint
    geospec's engine cannot reproduce exactly."""
    if heal.steps == 0:
        return
    from geospec.engine.imported import import_problem

    problem = import_problem(model)
    if problem is not None:
        raise UsageError(
            "prune.heal: healing fine-tunes the pruned models in geospec's engine, which "
            f"cannot reproduce this checkpoint exactly ({problem}); set heal.steps = 0"
        )


def teacher_of(reference: nn.Module, seq_len: int, heal: PruneHeal) -> Teacher:
    """The unpruned ``reference``, imported into geospec's engine, as the teacher that
    ``heal.distill`` distils from."""
    from geospec.engine.distill import Teacher
    from geospec.engine.identity import weights_digest
    from geospec.engine.imported import import_llama

    imported = import_llama(reference, seq_len)
    return Teacher(imported, weights_digest(imported.state_dict()), heal.distill, heal.temperature)


def heal_settings(
    heal: PruneHeal, seed: int, device: str, threads: int | None, seq_len: int
) -> TrainSpec:
    """The training settings of one pruned model's healing (evaluated on one window: the
    healed model is scored on the eval corpora afterwards)."""
    return TrainSpec(
        steps=heal.steps,
        batch_size=heal.batch_size,
        lr=heal.lr,
        warmup=heal.warmup,
        weight_decay=heal.weight_decay,
        seeds=[seed],
        device=device,
        threads=threads,
        eval_tokens=seq_len,
        # a line (and the bar's loss and tokens/s) at least every tenth of the healing: its
        # steps are slow on a CPU
        log_interval=max(1, min(10, heal.steps // 10)),
    )


def healed_losses(
    imported: GPT,
    settings: TrainSpec,
    directory: Path,
    key: str,
    seed: int,
    train: Trainer,
    corpora: Mapping[str, Sequence[Any]],
    say: Callable[[str], None] = lambda _: None,
) -> dict[str, float] | None:
    """Heal the imported pruned model into ``directory`` and return its loss on every corpus
    (None: another process holds the directory); ``say`` tells what runs after the training's
    own bar (scoring takes seconds to minutes on a CPU)."""
    import torch

    from geospec.engine.checkpoint import load_model
    from geospec.prune.losses import eval_loss

    # the imported model's own tensors, not a copy: training copies them into the model it
    # trains and never writes them (a copy cost the pruned model's size again, its tied
    # embedding twice)
    state = {k: v.detach() for k, v in imported.state_dict().items()}
    if not train(imported.config, state, settings, directory, key, seed):
        return None
    healed = load_model(directory, next(iter(corpora.values()))[0][0].device)
    batches = sum(len(found) for found in corpora.values())
    say(f"heal: the healed model's loss on {batches} batches of eval windows")
    with torch.no_grad():
        return {name: eval_loss(healed, batches) for name, batches in corpora.items()}
