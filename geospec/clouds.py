"""The probe stage: sample validation tokens, capture every layer's clouds, store them.

Clouds are written as ``clouds/layer-XXX.safetensors`` (tensors ``x`` and ``y``, n x d float32)
and ``clouds/meta.json`` last, so a directory without meta.json is never trusted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from geospec.atomic import atomic_path, atomic_write_json
from geospec.probe import probe_clouds, sample_tokens

if TYPE_CHECKING:
    from geospec.executor import Context


def reference_model(ctx: Context) -> tuple[Any, int]:
    """The probed model and its residual width, on the training device."""
    from geospec.train import resolve_device

    device = resolve_device(ctx.spec.train.device)
    checkpoint = ctx.spec.reference.checkpoint
    if checkpoint is not None:
        from geospec.pretrained import hidden_width, load_pretrained

        model = load_pretrained(checkpoint, device=str(device))
        return model, hidden_width(model)
    from geospec.checkpoint import load_model

    model = load_model(ctx.run_dir / "reference").to(device).eval()
    return model, model.config.d_model


def run_probe(ctx: Context, clouds_dir: Path) -> None:
    from rich.progress import Progress

    from geospec.executor import token_data

    spec = ctx.spec
    probe = spec.probe
    data = token_data(ctx)
    model, width = reference_model(ctx)
    seq_len = spec.model.seq_len
    skip_ids = [data.eot_id] if probe.skip_special else []
    sample = sample_tokens(
        data.val, seq_len, probe.tokens, probe.seed, probe.sequences, probe.skip_first, skip_ids
    )
    ctx.say(
        f"[bold]probe[/]: {probe.tokens} tokens from {len(sample.windows)} validation "
        f"windows, site {probe.site}"
    )
    with Progress(console=ctx.console, transient=True, disable=not ctx.console.is_terminal) as bar:
        task = bar.add_task("probing", total=len(sample.windows))
        clouds = probe_clouds(
            model,
            data.val,
            sample,
            seq_len,
            width,
            site=probe.site,
            batch_size=probe.batch_size,
            progress=lambda k: bar.advance(task, k),
        )
    if clouds_dir.exists():
        shutil.rmtree(clouds_dir)
    for layer, (x, y) in enumerate(clouds):
        with atomic_path(clouds_dir / f"layer-{layer:03d}.safetensors") as tmp:
            save_file({"x": x.contiguous(), "y": y.contiguous()}, str(tmp))
    atomic_write_json(
        clouds_dir / "meta.json",
        {
            "layers": len(clouds),
            "tokens": probe.tokens,
            "width": width,
            "site": probe.site,
            "windows": [int(w) for w in sample.windows],
        },
    )


def load_clouds(clouds_dir: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    files = sorted(clouds_dir.glob("layer-*.safetensors"))
    result = []
    for path in files:
        tensors = load_file(str(path))
        result.append((tensors["x"], tensors["y"]))
    return result
