"""How the prune stage heals a pruned model (``[prune.heal]``): imported, trained into its unit's
``heal/`` through :func:`geospec.pipeline.training.train_into` like every training run (claimed,
resumable, a failure recorded), optionally distilled from the unpruned reference, and scored
again on the eval corpora (:func:`geospec.prune.heal.healed_losses` does the import and scoring;
this module hands it the trainer)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geospec.errors import GeospecError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from geospec.engine.distill import Teacher
    from geospec.engine.model import GPT, GPTConfig
    from geospec.pipeline.context import RunContext
    from geospec.prune.study import Healer
    from geospec.prune.units import Unit
    from geospec.spec.sections import DataSpec, PruneHeal, TrainSpec


def healer(
    run: RunContext,
    heal: PruneHeal,
    seq_len: int,
    data: DataSpec,
    threads: int | None,
    corpora: dict[str, list[Any]],
    reference: nn.Module,
) -> Healer:
    """How a unit's pruned model is healed: trained into its ``heal/`` like any run (with
    ``heal.distill``, distilling from ``reference``, the unpruned model)."""
    from geospec.pipeline.training import TrainingJob, train_into
    from geospec.prune.heal import heal_settings, healed_losses, teacher_of

    teachers: list[Teacher] = []  # imported once, at the first healing that needs it

    def teacher() -> Teacher | None:
        if heal.distill == 0:
            return None
        if not teachers:
            teachers.append(teacher_of(reference, seq_len, heal))
        return teachers[0]

    def train(
        config: GPTConfig,
        initial: dict[str, torch.Tensor],
        settings: TrainSpec,
        out: Path,
        key: str,
        seed: int,
        *,
        announce: str,
    ) -> bool:
        tokens = run.token_data(data)
        job = TrainingJob(
            out, key, list(config.ffn_widths), config, settings, tokens, seed,
            initial=initial, teacher=teacher(),
        )  # fmt: skip
        # the training bar (step, loss, tokens/s, eta; a line per log interval in logs): the
        # prune's bar of units is off the screen meanwhile (prune.study.shown_alone)
        trained = train_into(run, job, announce=announce, progress=True)
        return trained is not None

    def healed(unit: Unit, out: Path, key: str, imported: GPT) -> dict[str, float]:
        settings = heal_settings(heal, unit.seed, run.device, threads, seq_len)
        distilled = ""
        if heal.distill:
            distilled = f", distilled from the unpruned model (distill {heal.distill:g})"
        batch = f"{settings.batch_size} x {seq_len} tokens"
        announce = f"[bold]heal[/]: {unit.label}, {settings.steps} steps of {batch}{distilled}"
        trainer = functools.partial(train, announce=announce)
        losses = healed_losses(imported, settings, out, key, unit.seed, trainer, corpora)
        if losses is None:
            raise GeospecError(
                f"prune: {out} is being healed by another process; wait for it to finish "
                "and run again"
            )
        return losses

    return healed
