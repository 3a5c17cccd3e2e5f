"""How the prune stage heals a pruned model (``[prune.heal]``): imported, trained into its unit's
``heal/`` through :func:`geospec.pipeline.training.train_into` like every training run (claimed,
resumable, a failure recorded), optionally distilled from the unpruned reference, and scored
again on the eval corpora (:func:`geospec.prune.heal.healed_losses` does the import and scoring;
this module hands it the trainer)."""

from __future__ import annotations

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
    ) -> bool:
        tokens = run.token_data(data)
        job = TrainingJob(
            out, key, list(config.ffn_widths), config, settings, tokens, seed,
            initial=initial, teacher=teacher(),
        )  # fmt: skip
        trained = train_into(run, job, progress=False)
        return trained is not None

    def healed(unit: Unit, out: Path, key: str, imported: GPT) -> dict[str, float]:
        settings = heal_settings(heal, unit.seed, run.device, threads, seq_len)
        losses = healed_losses(imported, settings, out, key, unit.seed, train, corpora)
        if losses is None:
            raise GeospecError(
                f"prune: {out} is being healed by another process; wait for it to finish "
                "and run again"
            )
        return losses

    return healed
