"""Calibration seed k's own profiles for ``prune.allocation_seeds``: measured again as the probe,
measure, diagnose and demand stages measure them, on the windows seed k draws (docs/prune.md,
"Allocation seeds"). The prune stage hands the result to :func:`geospec.prune.study.prune_units`,
which calls it once per calibration seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from geospec.spec.sections import DIAGNOSTIC_PROFILES, DataSpec, MeasureSpec, demand_profile_names

if TYPE_CHECKING:
    from torch import nn

    from geospec.pipeline.context import RunContext
    from geospec.pipeline.stages.demand import DemandStage
    from geospec.pipeline.stages.diagnose import Diagnose
    from geospec.pipeline.stages.probe import Probe


@dataclass(frozen=True)
class RedrawSettings:
    """How the run measures what the arms read: the probe's settings, the measures in effect
    and the diagnose and demand stages' settings (None where disabled), and ``[data]``."""

    probe: Probe
    measures: tuple[MeasureSpec, ...]
    diagnose: Diagnose | None
    demand: DemandStage | None
    data: DataSpec


def redrawn_profiles(
    run: RunContext,
    model: nn.Module,
    width: int,
    needed: set[str],
    settings: RedrawSettings,
) -> Callable[[int], dict[str, list[float]]]:
    """Calibration seed k's own measurement of the profiles of ``needed``: the probe's sample
    drawn as ``probe.seed = k`` draws it (from the probe's calibration split) and probed on
    ``model``; the measured profiles on it as the measure stage measures them (the mean over
    replicates), so the probe's own seed gives the run's back; the diagnostic ones on those
    clouds and on diagnose's windows drawn with seed k; the demand ones on demand's windows
    drawn with seed k (its ordering calibrated on the seed's probe windows). One process
    measures them (the prune stage runs on rank 0)."""
    from geospec.engine.distributed import DistContext
    from geospec.engine.train import resolve_device
    from geospec.measure import demand_record, diagnostics
    from geospec.measure.work import measure_profiles, measure_replicates

    entries = [entry for entry in settings.measures if entry.profile in needed]
    diagnose, demand = settings.diagnose, settings.demand
    diagnostic = needed & set(DIAGNOSTIC_PROFILES) if diagnose is not None else set()
    demanded = needed & set(demand_profile_names(demand.demand)) if demand is not None else set()
    data = run.token_data(settings.data)
    device = resolve_device(run.device, run.dist.local_rank)
    alone = replace(run, dist=DistContext())

    def profiles(seed: int) -> dict[str, list[float]]:
        drawn = settings.probe.probe.model_copy(update={"seed": seed})
        probe = replace(settings.probe, probe=drawn, loss_seed=seed)
        found: dict[str, list[float]] = {}
        clouds = None
        if entries or diagnostic:
            clouds = probe.clouds(model, width, data, probe.sample(data))
        if entries and clouds is not None:
            replicates = drawn.replicates
            if replicates == 1:
                found.update(measure_profiles(clouds, entries, progress=False, device=device))
            else:
                measured = measure_replicates(
                    clouds, replicates, entries, progress=False, device=device
                )
                found.update(
                    {
                        name: [sum(layer) / len(layer) for layer in zip(*values, strict=True)]
                        for name, values in measured.items()
                    }
                )
        if diagnostic and diagnose is not None:
            reference = replace(diagnose, probe=probe).measure_reference(alone, clouds)
            found.update(diagnostics.profiles_of(reference["layers"]))
        if demanded and demand is not None:
            keep = demand.demand.keep
            cuts = replace(demand, probe=probe).measure_reference(alone)
            found.update(
                demand_record.profiles_of(demand_record.fitted(cuts["layers"], keep), keep)
            )
        run.say(f"prune: seed {seed}: {len(found)} profiles measured on its own windows")
        return {name: values for name, values in found.items() if name in needed}

    return profiles
