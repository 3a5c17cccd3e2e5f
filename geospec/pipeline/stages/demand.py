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

from geospec.atomic import atomic_write_json
from geospec.digests import sealed
from geospec.errors import GeospecError
from geospec.pipeline.context import Done, Plan, RunContext
from geospec.pipeline.keys import data_key, digest
from geospec.pipeline.run_dir import (
    DEMAND_FILE,
    DEMAND_KEYS,
    MEASURED_KEYS,
    json_problem,
    read_demand,
    read_json,
)
from geospec.pipeline.stages.probe import Probe
from geospec.report.stats import finite
from geospec.spec.sections import DEMAND_PROFILES, DemandSpec, Spec

if TYPE_CHECKING:
    from torch import nn

    from geospec.measure.demand import Demand
    from geospec.measure.probe import FFNSite

#: Bootstrap resamples of the layers behind each correlation's interval.
BOOTSTRAP = 2000


@dataclass(frozen=True)
class DemandStage:
    name: ClassVar[str] = "demand"
    demand: DemandSpec
    probe: Probe
    """The probe's settings: the reference model, its data and the calibration windows."""
    multiple: int
    """Every kept width is a multiple of this (model.multiple_of)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> DemandStage:
        return cls(spec.demand, Probe.from_spec(spec), spec.model.multiple_of)

    def plan(self, run: RunContext, done: Mapping[str, Done], forced: bool) -> Plan:
        path = run.run_dir / DEMAND_FILE
        probe_key = done["probe"].key
        if not self.demand.enabled:
            if run.is_main and path.exists():
                stale = read_demand(run.run_dir)
                if stale is None or stale["keys"].get("probe") != probe_key:
                    path.unlink()  # from another reference or probe, or damaged: not reported
            return Plan(None, current=True)
        settings = self.demand.model_dump(mode="json", exclude={"enabled"})
        compute_key = digest(
            "demand",
            settings,
            probe_key,
            data_key(self.probe.data),
            self.probe.seq_len,
            self.multiple,
        )
        key = digest("demand", compute_key, done["measure"].key, done["diagnose"].key)
        keys = {"compute": compute_key, "probe": probe_key}
        others = {**(done["measure"].output or {}), **(done["diagnose"].output or {})}
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
        from geospec.report.plots import demand_plot

        previous = read_demand(run.run_dir) if reuse else None
        if previous is not None and previous.get("keys", {}).get("compute") == keys["compute"]:
            measured = {key: previous[key] for key in MEASURED_KEYS}
        else:
            measured = self.measure_reference(run)
        # the fits are cheap: computed again from the stored increases on every write
        measured["layers"] = fitted(measured["layers"], self.demand.keep)
        profiles = profiles_of(measured["layers"], self.demand.keep)
        record = {
            "profiles": profiles,
            **measured,
            "correlations": correlations(profiles, others, self.demand.pair_keep),
            "settings": self.demand.model_dump(mode="json", exclude={"enabled"}),
            "keys": keys,
        }
        atomic_write_json(path, sealed(record))
        demand_plot(run.run_dir, record, others)
        not_power_law = [row["layer"] for row in measured["layers"] if not row["fit"]["power_law"]]
        if not_power_law:
            run.say(
                f"demand: a power law does not describe layers {not_power_law} "
                "(fit R² below the threshold); their lambda and exponent are least-squares values"
            )
        return profiles

    def measure_reference(self, run: RunContext) -> dict[str, Any]:
        """Everything that needs the reference model: the orderings and the cuts' losses."""
        from geospec.engine.progress import stage_progress
        from geospec.measure.demand import CutPlan, measure_demand
        from geospec.measure.sensitivity import sample_pairs
        from geospec.plugin import create_plugin

        settings = self.demand
        seq_len = self.probe.seq_len
        setup = self.probe.loss_setup(run, settings.windows, settings.batch_size)
        model, batches, sites = setup.model, setup.batches, setup.sites
        importance = create_plugin("importance", settings.importance)
        orders = self._orders(run, model, sites, importance)
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
            f"{importance.kind_name()} ordering, loss on {windows} validation windows of "
            f"{seq_len} tokens"
        )
        total = len(batches) * (len(sites) * (len(settings.keep) + 1) + len(pairs))
        with stage_progress(run.console, run.say, f"{cuts} cuts", total) as advance:
            demand = measure_demand(model, sites, batches, plan, progress=advance)
        if demand.fallback is not None:
            run.say(
                "demand: full forward passes for every cut (slower, same numbers): "
                f"{demand.fallback}"
            )

        layers = [
            {
                "layer": layer,
                "width": demand.widths[layer],
                "kept": list(demand.kept[layer]),
                "increase": list(demand.increase[layer]),
            }
            for layer in range(len(sites))
        ]
        return {
            "loss": {"base": demand.base, "windows": windows, "tokens": windows * seq_len},
            "importance": settings.importance.model_dump(mode="json"),
            "keep": list(demand.keep),
            "multiple": self.multiple,
            "layers": layers,
            "additivity": additivity_record(demand),
            "orders": [list(order) for order in orders],
            "fallback": demand.fallback,
        }

    def _orders(
        self, run: RunContext, model: nn.Module, sites: Sequence[FFNSite], importance: Any
    ) -> list[list[int]]:
        """Every layer's neuron ordering by ``importance`` (with calibration activations over the
        probe's windows when the score needs them)."""
        from geospec.measure.cut import CutError, ffn_layout, neuron_order, neuron_weights

        try:
            ffn_layout(sites[0].ffn)
        except CutError as error:
            raise CutError(
                f"demand: the FFN of {type(sites[0].layer).__name__} (the module the probe "
                f"maps as its FFN): {error}"
            ) from None
        stats: list[Any] = [None] * len(sites)
        if importance.needs_activations:
            stats = self._calibration(run, model, sites)
        return [
            neuron_order(importance, neuron_weights(site.ffn, layer, stats=stats[layer]))
            for layer, site in enumerate(sites)
        ]

    def _calibration(self, run: RunContext, model: nn.Module, sites: Sequence[FFNSite]) -> Any:
        """Every FFN's hidden-activation statistics (signed mean, mean |a|, mean square per
        neuron) over every token of the probe's windows."""
        import numpy as np
        import torch

        from geospec.engine.progress import stage_progress
        from geospec.measure.cut import activation_stats
        from geospec.measure.sensitivity import logits_of

        data = run.token_data(self.probe.data)
        sample = self.probe.sample(data)
        seq_len, batch = self.probe.seq_len, self.probe.probe.batch_size
        device = next(model.parameters()).device
        windows = np.stack([data.val[w : w + seq_len].astype(np.int64) for w in sample.windows])
        with (
            stage_progress(run.console, run.say, "calibrating", len(windows)) as advance,
            torch.no_grad(),
            activation_stats([site.ffn for site in sites]) as means,
        ):
            for start in range(0, len(windows), batch):
                ids = torch.as_tensor(windows[start : start + batch], device=device)
                logits_of(model, ids)
                advance(len(ids))
            return means()


def fitted(layers: Sequence[Mapping[str, Any]], keep: Sequence[float]) -> list[dict[str, Any]]:
    """Each layer's record with the power law fitted to its increases (``fit``)."""
    from geospec.measure.demand_fit import EXPONENT_RANGE, fit_demand

    low, high = EXPONENT_RANGE
    result = []
    for row in layers:
        fit = fit_demand(keep, row["increase"])
        # a_l is not pinned by the data where the search stopped at an end of its range
        at_bound = fit.sensitivity > 0 and not low * 1.001 < fit.exponent < high / 1.001
        result.append(
            {
                **{key: value for key, value in row.items() if key != "fit"},
                "fit": {
                    "lambda": fit.sensitivity,
                    "exponent": fit.exponent,
                    "r2": finite(fit.r2) if fit.r2 is not None else None,
                    "power_law": fit.power_law,
                    "exponent_at_bound": at_bound,
                },
            }
        )
    return result


def additivity_record(demand: Demand) -> dict[str, Any]:
    pairs: list[dict[str, Any]] = [
        {
            "layers": list(p.layers),
            "joint": p.joint,
            "sum_of_singles": p.singles,
            "interaction": p.interaction,
        }
        for p in demand.pairs
    ]
    return {
        "keep": demand.pair_keep,
        "slope": finite(demand.additivity_slope) if demand.additivity_slope is not None else None,
        "r2": finite(demand.additivity_r2) if demand.additivity_r2 is not None else None,
        "pairs": pairs,
        "worst": sorted(pairs, key=lambda p: -abs(p["interaction"]))[:5],
    }


def profiles_of(
    layers: Sequence[Mapping[str, Any]], keep: Sequence[float]
) -> dict[str, list[float]]:
    """The demand profiles: fitted lambda and exponent, and the increase at each fraction
    (negative increases, a cut that lowered the loss, become 0: demand is not negative)."""
    profiles = {
        "demand/lambda": [max(row["fit"]["lambda"], 0.0) for row in layers],
        "demand/exponent": [row["fit"]["exponent"] for row in layers],
        "demand/slope": [max(row["fit"]["lambda"], 0.0) * row["fit"]["exponent"] for row in layers],
    }
    for k, fraction in enumerate(keep):
        profiles[f"demand/f{fraction:g}"] = [max(row["increase"][k], 0.0) for row in layers]
    return profiles


def correlations(
    demand: Mapping[str, Sequence[float]],
    others: Mapping[str, Sequence[float]],
    pair_keep: float,
) -> dict[str, dict[str, Any]]:
    """Per other profile: Spearman's rho with the increase at ``pair_keep`` (the measured
    demand), with lambda x a and with lambda (the fit), each with a percentile bootstrap interval
    over layers."""
    from geospec.report.stats import spearman_interval

    targets = {
        "increase": demand[f"demand/f{pair_keep:g}"],
        "slope": demand["demand/slope"],
        "lambda": demand["demand/lambda"],
    }
    result: dict[str, dict[str, Any]] = {}
    for name, values in others.items():
        if len(values) != len(targets["lambda"]):
            continue  # a profile of another depth (read from a file) is not this model's
        result[name] = {
            target: spearman_interval(values, demand_values, BOOTSTRAP, seed=0)
            for target, demand_values in targets.items()
        }
    return result


def demand_problem(path: Path) -> str | None:
    """Why a demand.json that exists is written again: damaged, or fitted by an earlier geospec
    (its measurement is reused and fitted again)."""
    problem = json_problem(path, *DEMAND_KEYS)
    if problem is not None:
        return problem
    stored = read_json(path)
    fits = [row.get("fit", {}) for row in stored["layers"]]
    if any("exponent_at_bound" not in fit for fit in fits) or any(
        name not in stored["profiles"] for name in DEMAND_PROFILES
    ):
        return f"{path.name} holds fits of an earlier geospec; fitting its measurement again"
    return None


def demand_profiles(run_dir: Path) -> dict[str, list[float]]:
    """The demand profiles the solve stage can use (empty when there are none)."""
    demand = read_demand(run_dir)
    return dict(demand.get("profiles", {})) if demand else {}
