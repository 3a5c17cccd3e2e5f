"""The probe stage: sample tokens, capture every layer's clouds, store them.

The tokens come from ``probe.calibration_split`` of [data] (the validation split, or the
training split in a spec with [prune], whose eval windows must reach nothing but the pruned
models' scores): :meth:`Probe.tokens` is the one place that picks the split, for the probe and
for the diagnose and demand stages, which measure through this stage's settings.

Clouds are written as ``clouds/layer-XXX.safetensors`` (tensors ``x`` and ``y``, n x d float32)
and ``clouds/meta.json`` last, so a directory without meta.json is never trusted. meta.json
records the layer count, the shapes and each file's content hash; clouds that do not match it
(a file deleted, cut or changed) are probed again, and :func:`load_clouds` refuses them. With
``probe.replicates`` R > 1 each cloud holds R disjoint token samples one after the other
(meta.json records ``replicates``; its ``tokens`` counts every row). meta.json also records
the ``split`` the windows' start offsets index.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from geospec.atomic import atomic_path, atomic_write_json
from geospec.digests import file_digest
from geospec.errors import UsageError
from geospec.layout import CLOUDS_DIR, PROBE_META_FILE
from geospec.pipeline.context import Plan, RunContext, Upstream
from geospec.pipeline.keys import data_key, digest, section
from geospec.pipeline.stages.reference import compute_dtype, dtype_key
from geospec.spec.resolve import probes
from geospec.spec.sections import DataSpec, ProbeSpec, ReferenceSpec, Spec

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from geospec.engine.distributed import DistContext
    from geospec.engine.token_data import TokenData
    from geospec.measure.probe import FFNSite, TokenSample


@dataclass(frozen=True)
class LossSetup:
    """The reference and the batches its losses are measured on (the first windows of the
    probe's calibration split)."""

    model: nn.Module
    width: int
    """The residual-stream width."""
    data: TokenData
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    sites: list[FFNSite]

    @property
    def windows(self) -> int:
        return sum(len(x) for x, _ in self.batches)


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
        clouds_dir = run.run_dir / CLOUDS_DIR
        return Plan(
            key,
            run=lambda: self.write_clouds(run, clouds_dir),
            artifacts=(clouds_dir / PROBE_META_FILE,),
            problem=clouds_problem(clouds_dir) if (clouds_dir / PROBE_META_FILE).exists() else None,
            main_only=False,  # every rank probes its share of the windows (torchrun)
        )

    def write_clouds(self, run: RunContext, clouds_dir: Path) -> None:
        from safetensors.torch import save_file

        from geospec.engine.progress import stage_progress
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
        # only geospec's own files go: a folder named clouds/ may hold the user's too
        (clouds_dir / PROBE_META_FILE).unlink(missing_ok=True)
        for old in clouds_dir.glob("layer-*.safetensors"):
            old.unlink()
        digests = {}
        for layer, (x, y) in enumerate(clouds):
            path = clouds_dir / cloud_file(layer)
            with atomic_path(path) as tmp:
                save_file({"x": x.contiguous(), "y": y.contiguous()}, str(tmp))
            digests[path.name] = file_digest(path)
        # "tokens" counts a cloud's rows: with replicates, each one's tokens one after the other
        replicates = {"replicates": probe.replicates} if probe.replicates > 1 else {}
        atomic_write_json(
            clouds_dir / PROBE_META_FILE,
            {
                "layers": len(clouds),
                "tokens": probe.tokens * probe.replicates,
                **replicates,
                "width": width,
                "site": probe.site,
                "split": probe.calibration_split,
                "windows": [int(w) for w in sample.windows],
                "digests": digests,
            },
        )

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
        from geospec.measure.probe import find_ffn_sites
        from geospec.measure.sensitivity import (
            drawn_loss_batches,
            logits_of,
            loss_batches,
            scored_text,
        )
        from geospec.pipeline.stages.reference import load_reference

        data = run.token_data(self.data)
        model, width = load_reference(run, self.reference)
        device = next(model.parameters()).device
        text = scored_text(self.tokens(data), data.eot_id if self.data.end_of_text else None)
        if self.loss_seed is None:
            batches = loss_batches(text, self.seq_len, windows, batch_size, device, data.bos_id)
        else:
            batches = drawn_loss_batches(
                text, self.seq_len, windows, batch_size, device, self.loss_seed, data.bos_id
            )
        sites = find_ffn_sites(model, width, lambda: logits_of(model, batches[0][0][:1]))
        return LossSetup(model, width, data, batches, sites)

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


def cloud_file(layer: int) -> str:
    return f"layer-{layer:03d}.safetensors"


def clouds_problem(clouds_dir: Path) -> str | None:
    """What keeps the stored clouds from being trusted (None when they match meta.json)."""
    from safetensors import SafetensorError, safe_open

    meta_path = clouds_dir / PROBE_META_FILE
    try:
        meta = json.loads(meta_path.read_text())
        layers, tokens, width = int(meta["layers"]), int(meta["tokens"]), int(meta["width"])
        digests = meta.get("digests")  # absent in clouds probed by older geospec versions
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return f"{meta_path} is unreadable"
    files = sorted(p.name for p in clouds_dir.glob("layer-*.safetensors"))
    if files != [cloud_file(layer) for layer in range(layers)]:
        return f"{clouds_dir} holds {len(files)} layer files, {PROBE_META_FILE} says {layers}"
    for name in files:
        path = clouds_dir / name
        try:
            with safe_open(str(path), framework="pt") as handle:
                shapes = {key: handle.get_slice(key).get_shape() for key in ("x", "y")}
        except (OSError, SafetensorError, KeyError):
            return f"{path} is unreadable"
        if any(list(shape) != [tokens, width] for shape in shapes.values()):
            expected = [tokens, width]
            return f"{path} holds clouds of shape {shapes['x']}, {PROBE_META_FILE} says {expected}"
        if isinstance(digests, dict) and file_digest(path) != digests.get(name):
            return f"{path} changed after it was probed"
    return None


def cloud_replicates(clouds_dir: Path) -> int:
    """How many disjoint token samples the stored clouds hold, one after the other (1 for
    clouds probed without probe.replicates)."""
    meta = json.loads((clouds_dir / PROBE_META_FILE).read_text())
    return int(meta.get("replicates", 1))


def load_clouds(clouds_dir: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The stored clouds, layer by layer, checked against meta.json."""
    from safetensors.torch import load_file

    problem = clouds_problem(clouds_dir)
    if problem is not None:
        raise UsageError(f"{problem}; run again with --from probe")
    count = int(json.loads((clouds_dir / PROBE_META_FILE).read_text())["layers"])
    result = []
    for layer in range(count):
        tensors = load_file(str(clouds_dir / cloud_file(layer)))
        result.append((tensors["x"], tensors["y"]))
    return result
