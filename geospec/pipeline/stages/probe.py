"""The probe stage: sample validation tokens, capture every layer's clouds, store them.

Clouds are written as ``clouds/layer-XXX.safetensors`` (tensors ``x`` and ``y``, n x d float32)
and ``clouds/meta.json`` last, so a directory without meta.json is never trusted.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from geospec.atomic import atomic_path, atomic_write_json
from geospec.pipeline.context import Done, Plan, RunContext
from geospec.pipeline.keys import data_key, digest, section
from geospec.pipeline.run_dir import CLOUDS_DIR
from geospec.spec.sections import DataSpec, ProbeSpec, Spec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from geospec.engine.token_data import TokenData
    from geospec.measure.probe import TokenSample

META_FILE = "meta.json"


@dataclass(frozen=True)
class Probe:
    name: ClassVar[str] = "probe"
    probe: ProbeSpec
    data: DataSpec
    seq_len: int
    checkpoint: str | None
    """The pretrained reference, if any (else the run's own reference/)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Probe:
        return cls(spec.probe, spec.data, spec.model.seq_len, spec.reference.checkpoint)

    def plan(self, run: RunContext, done: Mapping[str, Done], forced: bool) -> Plan:
        # the data section matters too: a pretrained reference's key covers only its checkpoint
        key = digest("probe", section(self.probe), done["reference"].key, data_key(self.data))
        clouds_dir = run.run_dir / CLOUDS_DIR
        return Plan(
            key, run=lambda: self.write_clouds(run, clouds_dir), artifacts=(clouds_dir / META_FILE,)
        )

    def write_clouds(self, run: RunContext, clouds_dir: Path) -> None:
        from rich.progress import Progress
        from safetensors.torch import save_file

        from geospec.pipeline.stages.reference import load_reference

        probe = self.probe
        data = run.token_data(self.data)
        model, width = load_reference(run, self.checkpoint)
        sample = self.sample(data)
        run.say(
            f"[bold]probe[/]: {probe.tokens} tokens from {len(sample.windows)} validation "
            f"windows, site {probe.site}"
        )
        with Progress(
            console=run.console, transient=True, disable=not run.console.is_terminal
        ) as bar:
            task = bar.add_task("probing", total=len(sample.windows))
            clouds = self.clouds(
                model, width, data, sample, progress=lambda k: bar.advance(task, k)
            )
        if clouds_dir.exists():
            shutil.rmtree(clouds_dir)
        for layer, (x, y) in enumerate(clouds):
            with atomic_path(clouds_dir / f"layer-{layer:03d}.safetensors") as tmp:
                save_file({"x": x.contiguous(), "y": y.contiguous()}, str(tmp))
        atomic_write_json(
            clouds_dir / META_FILE,
            {
                "layers": len(clouds),
                "tokens": probe.tokens,
                "width": width,
                "site": probe.site,
                "windows": [int(w) for w in sample.windows],
            },
        )

    def sample(self, data: TokenData) -> TokenSample:
        """The probed token positions (the same for every call with the same settings)."""
        from geospec.measure.probe import sample_tokens

        probe = self.probe
        skip_ids = [data.eot_id] if probe.skip_special else []
        return sample_tokens(
            data.val,
            self.seq_len,
            probe.tokens,
            probe.seed,
            probe.sequences,
            probe.skip_first,
            skip_ids,
        )

    def clouds(
        self,
        model: nn.Module,
        width: int,
        data: TokenData,
        sample: TokenSample,
        site: str | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's (x, y) clouds at the sampled positions, at ``site`` (default: the
        probe's own)."""
        from geospec.measure.probe import probe_clouds

        return probe_clouds(
            model,
            data.val,
            sample,
            self.seq_len,
            width,
            site=site or self.probe.site,
            batch_size=self.probe.batch_size,
            progress=progress,
        )


def load_clouds(clouds_dir: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The stored clouds, layer by layer."""
    from safetensors.torch import load_file

    result = []
    for path in sorted(clouds_dir.glob("layer-*.safetensors")):
        tensors = load_file(str(path))
        result.append((tensors["x"], tensors["y"]))
    return result
