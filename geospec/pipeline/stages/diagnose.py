"""The diagnose stage: what the reference model says about the method's premises.

Per layer: the mean residual-stream norm, the TwoNN intrinsic dimension of the cloud entering the
FFN (with its fit quality), and the layer sensitivity (the loss increase when the FFN sub-layer's
output is scaled by 1 - eps, and when it is removed). Over sampled layer pairs: local additivity
(the joint loss change against the sum of the singles). Against the measured work profiles:
Spearman rank correlations with the residual norm and with layer sensitivity
(:mod:`geospec.measure.diagnostics`).

``diagnostics.json`` holds it all, with ``profiles`` (the per-layer quantities named as in
:data:`geospec.spec.sections.DIAGNOSTIC_PROFILES`) in the same shape as profiles.json, which the
solve stage merges with the measured profiles; ``plots/diagnostics.png`` and
``plots/additivity.png`` draw it. The reference's measurements are keyed by the diagnose
settings, the probe and the data; the correlations also by the measure stage, so adding a profile
only recomputes correlations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from geospec.errors import GeospecError
from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import data_key, digest
from geospec.pipeline.stages.probe import Probe, drop_stale_record
from geospec.pipeline.stages.reference import compute_dtype, dtype_key, reference_computing
from geospec.rundir.artifacts import json_problem
from geospec.rundir.layout import CLOUDS_DIR, DIAGNOSTICS_FILE
from geospec.rundir.records import DIAGNOSTICS_KEYS, read_diagnostics, stored_measurement
from geospec.spec.resolve import measures
from geospec.spec.sections import DiagnoseSpec, MeasureSpec, Spec
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import sealed

if TYPE_CHECKING:
    import torch

    from geospec.measure.sensitivity import LossSetup


@dataclass(frozen=True)
class Diagnose:
    name: ClassVar[str] = "diagnose"
    reads: ClassVar[tuple[str, ...]] = ("probe", "measure")
    diagnose: DiagnoseSpec
    probe: Probe
    """The probe's settings: the reference model, its data and the probed tokens."""
    entries: tuple[MeasureSpec, ...]
    """The measured profiles, correlated with the diagnostics."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Diagnose:
        return cls(spec.diagnose, Probe.from_spec(spec), tuple(measures(spec)))

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        path = run.run_dir / DIAGNOSTICS_FILE
        probe_key = upstream.key("probe")
        if not self.diagnose.enabled:
            drop_stale_record(run, path, read_diagnostics, upstream)
            return Plan(None, current=True)
        settings = self.diagnose.model_dump(mode="json", exclude={"enabled", "compute_dtype"})
        dtype = self.dtype(run)
        compute_key = digest(
            "diagnose", settings, probe_key, data_key(self.probe.data), self.probe.seq_len,
            *dtype_key(dtype, self.probe.reference),
        )  # fmt: skip
        key = digest("diagnose", compute_key, upstream.key("measure"))
        keys = {"compute": compute_key, "probe": probe_key}
        profiles = upstream.output("measure") or {}
        return Plan(
            key,
            run=lambda: self.write(run, path, keys, profiles, reuse=not forced),
            load=lambda: diagnostic_profiles(run.run_dir),
            artifacts=(path,),
            problem=json_problem(path, *DIAGNOSTICS_KEYS) if path.exists() else None,
            main_only=False,  # every rank runs its share of the layers and perturbations
        )

    def write(
        self,
        run: RunContext,
        path: Path,
        keys: dict[str, str | None],
        work: Mapping[str, list[float]],
        reuse: bool,
    ) -> dict[str, list[float]]:
        """Write diagnostics.json and its plots; return the diagnostic profiles."""
        from geospec.measure.diagnostics import diagnostics_record, scale_sensitive_profiles
        from geospec.report.plots import diagnostic_plots

        previous = read_diagnostics(run.run_dir) if reuse else None
        measured = stored_measurement(previous, keys["compute"], ("loss", "layers", "additivity"))
        if measured is None:
            measured = self.measure_reference(run)
        settings = self.diagnose.model_dump(mode="json", exclude={"enabled"})
        scale_sensitive = scale_sensitive_profiles(self.entries)
        diagnostics = diagnostics_record(measured, work, scale_sensitive, settings, keys)
        if run.is_main:  # every rank measured its share; rank 0 writes
            atomic_write_json(path, sealed(diagnostics))
            diagnostic_plots(run.run_dir, diagnostics)
        return dict(diagnostics["profiles"])

    def dtype(self, run: RunContext) -> str:
        """The dtype its forward passes compute in (diagnose.compute_dtype resolved)."""
        requested = self.diagnose.compute_dtype
        return compute_dtype(run, requested, self.probe.reference, "diagnose.compute_dtype")

    def measure_reference(
        self, run: RunContext, clouds: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    ) -> dict[str, Any]:
        """Everything that needs the reference model: norms, TwoNN, sensitivity, additivity;
        on ``clouds`` (default: the probe stage's, from the run directory); its forward passes
        in :meth:`dtype`."""
        with reference_computing(run, self.dtype(run)):
            return self._measured(run, clouds)

    def _measured(
        self, run: RunContext, clouds: list[tuple[torch.Tensor, torch.Tensor]] | None
    ) -> dict[str, Any]:
        from geospec.engine.progress import stage_progress
        from geospec.measure.clouds import load_clouds
        from geospec.measure.diagnostics import measured_record
        from geospec.measure.intrinsic_dimension import layer_dimensions
        from geospec.measure.sensitivity import sample_pairs
        from geospec.measure.suffix import perturb_layers

        settings = self.diagnose
        seq_len = self.probe.seq_len
        world = run.dist.world_size  # under torchrun rank 0's bars count its share for every rank's
        setup = self.probe.loss_setup(run, settings.windows, settings.batch_size)
        sites, windows = setup.sites, setup.windows
        if clouds is None:
            clouds = load_clouds(run.run_dir / CLOUDS_DIR)
        pairs = sample_pairs(len(sites), settings.pairs, settings.seed)
        run.say(
            f"[bold]diagnose[/]: {len(sites)} layers, loss on {windows} "
            f"{self.probe.split_name} windows of "
            f"{seq_len} tokens, eps {settings.eps}, {len(pairs)} layer pairs"
        )
        if len(clouds) != len(sites):
            raise GeospecError(
                f"diagnose: {len(clouds)} probed clouds but the reference has {len(sites)} layers; "
                "rerun with --from probe"
            )
        with stage_progress(run.console, run.say, "TwoNN", len(clouds), run.is_main) as advance:
            try:
                dimensions = layer_dimensions(
                    clouds, settings.twonn_discard, lambda k: advance(k * world), run.dist
                )
            except GeospecError as error:
                raise GeospecError(f"diagnose: {error}") from None
        norms = self._residual_norms(run, setup, clouds)
        # one unit: one perturbation (a layer's FFN scaled or removed, or a pair) on one batch
        total = len(setup.batches) * (2 * len(sites) + len(pairs))
        with stage_progress(run.console, run.say, "perturbing", total, run.is_main) as advance:
            perturbations = perturb_layers(
                setup.model,
                sites,
                setup.batches,
                settings.eps,
                pairs,
                progress=lambda k: advance(k * world),
                dist=run.dist,
            )
        if perturbations.fallback is not None:
            run.say(
                "diagnose: full forward passes for every perturbation (slower, same numbers): "
                f"{perturbations.fallback}"
            )
        split = self.probe.probe.calibration_split
        loss = {
            "windows": windows,
            "tokens": windows * seq_len,
            "eps": settings.eps,
            "split": split,
        }
        return measured_record(dimensions, norms, perturbations, loss)

    def _residual_norms(
        self, run: RunContext, setup: LossSetup, clouds: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> list[tuple[float, float]]:
        """The mean residual-stream norms at the probed tokens, on every rank: from the stored
        clouds, or (with ``probe.site = "ffn"``, whose clouds are normalised FFN inputs and
        outputs) from the same tokens probed again at the residual site, every rank probing its
        share of the windows and rank 0 measuring the norms."""
        from geospec.engine.distributed import gather_stage_objects
        from geospec.engine.progress import stage_progress
        from geospec.measure.diagnostics import residual_norms

        if self.probe.probe.site == "residual":
            return residual_norms(clouds)
        sample = self.probe.sample(setup.data)
        with stage_progress(
            run.console, run.say, "probing the residual stream", len(sample.windows), run.is_main
        ) as advance:
            world = run.dist.world_size  # rank 0's bar counts its share for every rank's
            residual = self.probe.clouds(
                setup.model, setup.width, setup.data, sample, site="residual",
                progress=lambda k: advance(k * world), dist=run.dist,
            )  # fmt: skip
        norms: list[tuple[float, float]] = gather_stage_objects(
            residual_norms(residual) if run.is_main else None, run.dist
        )[0]
        return norms


def diagnostic_profiles(run_dir: Path) -> dict[str, list[float]]:
    """The diagnostic profiles the solve stage can use (empty when there are none)."""
    diagnostics = read_diagnostics(run_dir)
    return dict(diagnostics.get("profiles", {})) if diagnostics else {}
