"""The demand stage: what each layer's FFN needs, measured by cutting it on the reference.

Every layer's neurons are ordered by the spec's importance plugin (once, stored in
``demand.json`` and reused), then each layer alone keeps each fraction of its neurons and the
validation-loss increase is measured (:mod:`geospec.measure.demand`); sampled layer pairs cut
together check additivity. Each layer's curve is fitted to the surrogate lambda_l ((w/W)^-a_l - 1)
(:mod:`geospec.measure.demand_fit`); the layers a power law does not describe are named.

``demand.json`` (sealed) holds it all, with ``profiles`` (``demand/lambda``, ``demand/exponent``
and ``demand/f<fraction>``: the measured increase at each fraction, negative increases clipped to
0) in the shape of profiles.json, which the solve stage merges with the other profiles, and the
Spearman correlation of every other profile (measured and diagnostic) with the demand, with a
bootstrap interval over layers. ``plots/demand.png`` draws the curves and lambda_l beside the
geometric profiles. The measurement is keyed by the demand settings, the probe, the data and
the rounding multiple; the correlations also by the measure and diagnose stages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from geospec.errors import GeospecError
from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import data_key, digest
from geospec.pipeline.stages.probe import Probe, clouds_key, drop_stale_record
from geospec.pipeline.stages.reference import compute_dtype, dtype_key, reference_computing
from geospec.rundir.layout import DEMAND_FILE
from geospec.rundir.records import MEASURED_KEYS, read_demand, stored_measurement
from geospec.spec.sections import DemandSpec, Spec
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import sealed

if TYPE_CHECKING:
    from torch import nn

    from geospec.measure.probe import FFNSite


@dataclass(frozen=True)
class DemandStage:
    name: ClassVar[str] = "demand"
    reads: ClassVar[tuple[str, ...]] = ("probe", "measure", "diagnose")
    demand: DemandSpec
    probe: Probe
    """The probe's settings: the reference model, its data and the calibration windows."""
    multiple: int
    """Every kept width is a multiple of this (model.multiple_of)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> DemandStage:
        return cls(spec.demand, Probe.from_spec(spec), spec.model.multiple_of)

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan:
        path = run.run_dir / DEMAND_FILE
        # the probe's settings and reference, which the cuts' windows and orderings come from;
        # the same key whether or not the probe ran (no clouds are read here)
        probe_key = clouds_key(upstream)
        if not self.demand.enabled:
            drop_stale_record(run, path, read_demand, upstream)
            return Plan(None, current=True)
        settings = self.demand.model_dump(mode="json", exclude={"enabled", "compute_dtype"})
        compute_key = digest(
            "demand",
            settings,
            probe_key,
            data_key(self.probe.data),
            self.probe.seq_len,
            self.multiple,
            *dtype_key(self.dtype(run), self.probe.reference),
        )
        key = digest("demand", compute_key, upstream.key("measure"), upstream.key("diagnose"))
        keys = {"compute": compute_key, "probe": probe_key}
        others = upstream.profiles()  # measured and diagnostic: the demand's own come later
        from geospec.measure.demand_record import demand_problem

        return Plan(
            key,
            run=lambda: self.write(run, path, keys, others, reuse=not forced),
            load=lambda: demand_profiles(run.run_dir),
            artifacts=(path,),
            problem=demand_problem(path) if path.exists() else None,
        )

    def write(
        self,
        run: RunContext,
        path: Path,
        keys: dict[str, str | None],
        others: Mapping[str, Sequence[float]],
        reuse: bool,
    ) -> dict[str, list[float]]:
        """Write demand.json and its plot; return the demand profiles."""
        from geospec.measure.demand_record import demand_record
        from geospec.report.plots import demand_plot

        previous = read_demand(run.run_dir) if reuse else None
        measured = stored_measurement(previous, keys["compute"], MEASURED_KEYS)
        if measured is None:
            measured = self.measure_reference(run)
        settings = self.demand.model_dump(mode="json", exclude={"enabled"})
        keep, pair_keep = self.demand.keep, self.demand.pair_keep
        record = demand_record(measured, others, keep, pair_keep, settings, keys)
        atomic_write_json(path, sealed(record))
        demand_plot(run.run_dir, record, others)
        not_power_law = [row["layer"] for row in record["layers"] if not row["fit"]["power_law"]]
        if not_power_law:
            run.say(
                f"demand: a power law does not describe layers {not_power_law} "
                "(fit R² below the threshold); their lambda and exponent are least-squares values"
            )
        return dict(record["profiles"])

    def dtype(self, run: RunContext) -> str:
        """The dtype its forward passes compute in (demand.compute_dtype resolved)."""
        requested = self.demand.compute_dtype
        return compute_dtype(run, requested, self.probe.reference, "demand.compute_dtype")

    def measure_reference(self, run: RunContext) -> dict[str, Any]:
        """Everything that needs the reference model: the orderings and the cuts' losses, its
        forward passes in :meth:`dtype`."""
        with reference_computing(run, self.dtype(run)):
            return self._measured(run)

    def _measured(self, run: RunContext) -> dict[str, Any]:
        from geospec.engine.progress import stage_progress
        from geospec.measure.cut import CutError
        from geospec.measure.demand import CutPlan, measure_demand, neuron_orders
        from geospec.measure.demand_record import measured_record
        from geospec.measure.sensitivity import sample_pairs
        from geospec.plugin import create_plugin

        settings = self.demand
        seq_len = self.probe.seq_len
        setup = self.probe.loss_setup(run, settings.windows, settings.batch_size)
        model, batches, sites = setup.model, setup.batches, setup.sites
        importance = create_plugin("importance", settings.importance)
        try:
            orders = neuron_orders(sites, importance, lambda: self._calibration(run, model, sites))
        except CutError as error:
            raise CutError(f"demand: {error}") from None
        pairs = sample_pairs(len(sites), settings.pairs, settings.seed) if settings.pairs else []
        try:
            plan = CutPlan.of(orders, settings.keep, self.multiple, pairs, settings.pair_keep)
        except GeospecError as error:
            raise type(error)(f"demand.keep: {error}") from None
        windows = setup.windows
        cuts = len(sites) * len(settings.keep) + len(pairs)
        run.say(
            f"[bold]demand[/]: {len(sites)} layers x {len(settings.keep)} keep fractions "
            f"({', '.join(f'{f:g}' for f in settings.keep)}) and {len(pairs)} pairs, "
            f"{importance.kind_name()} ordering, loss on {windows} {self.probe.split_name} "
            f"windows of {seq_len} tokens"
        )
        total = len(batches) * (len(sites) * (len(settings.keep) + 1) + len(pairs))
        # counted in forward passes (a batch through one cut), the unit the work is done in
        with stage_progress(run.console, run.say, f"{cuts} cuts, forward passes", total) as advance:
            demand = measure_demand(model, sites, batches, plan, progress=advance)
        if demand.fallback is not None:
            run.say(
                "demand: full forward passes for every cut (slower, same numbers): "
                f"{demand.fallback}"
            )
        split = self.probe.probe.calibration_split
        loss = {"windows": windows, "tokens": windows * seq_len, "split": split}
        importance_ref = settings.importance.model_dump(mode="json")
        return measured_record(demand, orders, importance_ref, self.multiple, loss)

    def _calibration(self, run: RunContext, model: nn.Module, sites: Sequence[FFNSite]) -> Any:
        """Every FFN's hidden-activation statistics (signed mean, mean |a|, mean square per
        neuron) over every token of the probe's windows."""
        from geospec.engine.progress import stage_progress
        from geospec.measure.calibration import calibrate_on
        from geospec.measure.probe import sample_windows

        data = run.token_data(self.probe.data)
        tokens = self.probe.tokens(data)  # the probe's split: training text in a prune
        sample = self.probe.sample(data)
        windows = sample_windows(tokens, sample, self.probe.seq_len, data.bos_id)
        with stage_progress(run.console, run.say, "calibrating", len(windows)) as advance:
            found = calibrate_on(
                model, sites, windows, self.probe.probe.batch_size, progress=advance
            )
        return found.stats


def demand_profiles(run_dir: Path) -> dict[str, list[float]]:
    """The demand profiles the solve stage can use (empty when there are none)."""
    demand = read_demand(run_dir)
    return dict(demand.get("profiles", {})) if demand else {}
