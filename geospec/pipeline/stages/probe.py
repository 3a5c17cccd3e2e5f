"""The probe stage: sample tokens, capture every layer's clouds, store them.

The tokens come from ``probe.calibration_split`` of [data] (the validation split, or the
training split in a spec with [prune], whose eval windows must reach nothing but the pruned
models' scores): :meth:`Probe.tokens` is the one place that picks the split, for the probe and
for the diagnose and demand stages, which measure through this stage's settings.

The clouds are stored, checked and read back by :mod:`geospec.measure.clouds`
(``clouds/layer-XXX.safetensors``, and ``clouds/meta.json`` written last).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import data_key, digest, section
from geospec.pipeline.stages.reference import compute_dtype, dtype_key
from geospec.rundir.layout import CLOUDS_DIR, PROBE_META_FILE
from geospec.spec.resolve import probes
from geospec.spec.sections import DataSpec, ProbeSpec, ReferenceSpec, Spec

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from geospec.engine.distributed import DistContext
    from geospec.engine.token_data import TokenData
    from geospec.measure.probe import TokenSample
    from geospec.measure.sensitivity import LossSetup


@dataclass(frozen=True)
class Probe:
    name: ClassVar[str] = "probe"
    reads: ClassVar[tuple[str, ...]] = ("reference",)
    probe: ProbeSpec
    data: DataSpec
    seq_len: int
    reference: ReferenceSpec
    """Which model is probed: a pretrained checkpoint, or the run's own reference/."""
    loss_seed: int | None = None
    """None: diagnose and demand measure their losses on the first windows of the calibration
    split; k: on windows drawn with seed k (prune.allocation_seeds' seed k)."""
    needed: bool = True
    """Whether a later stage reads the clouds or this stage's key
    (:func:`geospec.spec.resolve.probes`); when none does, the stage does not apply."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Probe:
        return cls(spec.probe, spec.data, spec.model.seq_len, spec.reference, needed=probes(spec))

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        # the data section matters too: a pretrained reference's key covers only its checkpoint
        dtype = compute_dtype(run, self.probe.compute_dtype, self.reference, "probe.compute_dtype")
        key = digest(
            "probe",
            section(self.probe.model_copy(update={"compute_dtype": "float32"})),
            upstream.key("reference"),
            data_key(self.data),
            *dtype_key(dtype, self.reference),
        )
        if not self.needed:  # as the prune stage without [prune]: no key recorded, no clouds
            return Plan(
                None,
                current=True,
                # the key the clouds would have: what a kept diagnostics.json or demand.json
                # (their stages turned off since) is checked against (:func:`clouds_key`)
                load=lambda: key,
                note="[dim]- probe: not needed (no profile is measured, \\[diagnose] is off: "
                "nothing reads the clouds)[/]",
            )
        from geospec.measure.clouds import clouds_problem

        clouds_dir = run.run_dir / CLOUDS_DIR
        return Plan(
            key,
            run=lambda: self.write_clouds(run, clouds_dir),
            artifacts=(clouds_dir / PROBE_META_FILE,),
            problem=clouds_problem(clouds_dir) if (clouds_dir / PROBE_META_FILE).exists() else None,
            main_only=False,  # every rank probes its share of the windows (torchrun)
        )

    def write_clouds(self, run: RunContext, clouds_dir: Path) -> None:
        from geospec.engine.progress import stage_progress
        from geospec.measure.clouds import store_clouds
        from geospec.pipeline.stages.reference import load_reference

        probe = self.probe
        data = run.token_data(self.data)
        model, width = load_reference(run, self.reference)
        sample = self.sample(data)
        samples = f"{probe.replicates} x " if probe.replicates > 1 else ""
        run.say(
            f"[bold]probe[/]: {samples}{probe.tokens} tokens from {len(sample.windows)} "
            f"{self.split_name} windows, site {probe.site}"
        )
        with stage_progress(
            run.console, run.say, "probing", len(sample.windows), run.is_main
        ) as advance:
            # every rank probes its share of the windows; rank 0 gets the clouds and writes them
            # (its bar counts its share for every rank's)
            world = run.dist.world_size
            clouds = self.clouds(
                model, width, data, sample, progress=lambda k: advance(k * world), dist=run.dist
            )
        if not run.is_main:
            return
        store_clouds(clouds_dir, clouds, probe, width, sample)

    @property
    def split_name(self) -> str:
        """The calibration split as messages name it."""
        return "training" if self.probe.calibration_split == "train" else "validation"

    def tokens(self, data: TokenData) -> np.ndarray:
        """The tokens the reference is measured on: ``probe.calibration_split`` of ``data``
        (the training split in a prune, so that no eval window reaches a width)."""
        return data.train if self.probe.calibration_split == "train" else data.val

    def loss_setup(self, run: RunContext, windows: int, batch_size: int) -> LossSetup:
        """The reference model with its FFN sites and the first ``windows`` windows of the
        calibration split (:meth:`tokens`; drawn with ``loss_seed`` when it is set) in batches:
        what the diagnose and demand stages measure losses on."""
        from geospec.measure.sensitivity import loss_setup
        from geospec.pipeline.stages.reference import load_reference

        data = run.token_data(self.data)
        model, width = load_reference(run, self.reference)
        return loss_setup(
            model, width, data, self.tokens(data), self.seq_len, windows, batch_size,
            end_of_text=self.data.end_of_text, seed=self.loss_seed,
        )  # fmt: skip

    def sample(self, data: TokenData) -> TokenSample:
        """The probed token positions (the same for every call with the same settings)."""
        from geospec.measure.probe import sample_tokens

        probe = self.probe
        skip_ids = [data.eot_id] if probe.skip_special else []
        return sample_tokens(
            self.tokens(data),
            self.seq_len,
            probe.tokens,
            probe.seed,
            probe.sequences,
            probe.skip_first,
            skip_ids,
            probe.replicates,
            split=self.split_name,
        )

    def clouds(
        self,
        model: nn.Module,
        width: int,
        data: TokenData,
        sample: TokenSample,
        site: str | None = None,
        progress: Callable[[int], None] | None = None,
        dist: DistContext | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (x, y) clouds at the sampled positions, at ``site`` (default: the
        probe's own); with ``dist``, on rank 0 only (see
        :func:`geospec.measure.probe.probe_clouds`)."""
        from geospec.engine.precision import model_computing
        from geospec.measure.probe import probe_clouds

        with model_computing(model, self.probe.compute_dtype, "probe.compute_dtype"):
            return probe_clouds(
                model,
                self.tokens(data),
                sample,
                self.seq_len,
                width,
                site=site or self.probe.site,
                batch_size=self.probe.batch_size,
                progress=progress,
                dist=dist,
                bos=data.bos_id,
            )


def clouds_key(upstream: Upstream) -> str | None:
    """The probe stage's key, or where it does not apply (nothing reads the clouds) the key its
    clouds would have: a diagnose or demand stage turned off keeps its record for the report
    while it was measured on the reference and probe settings of this key."""
    key = upstream.key("probe")
    if key is None:
        key = upstream.output("probe")
    return key if isinstance(key, str) else None


def drop_stale_record(
    run: RunContext,
    path: Path,
    read: Callable[[Path], Mapping[str, Any] | None],
    upstream: Upstream,
) -> None:
    """The record a diagnose or demand stage turned off left at ``path`` (``read`` from the run
    directory) stays for the report while it was measured on the reference and probe settings
    the run has now (:func:`clouds_key`)."""
    if run.is_main and path.exists():
        stored = read(run.run_dir)
        if stored is None or stored["keys"].get("probe") != clouds_key(upstream):
            path.unlink()  # from another reference or probe, or damaged: not reported
