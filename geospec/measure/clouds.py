"""The probed clouds in a run directory: stored, checked against their record, read back.

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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from geospec.errors import UsageError
from geospec.rundir.layout import PROBE_META_FILE
from geospec.storage.atomic import atomic_path, atomic_write_json
from geospec.storage.digests import file_digest

if TYPE_CHECKING:
    import torch

    from geospec.measure.probe import TokenSample
    from geospec.spec.sections import ProbeSpec


def cloud_file(layer: int) -> str:
    return f"layer-{layer:03d}.safetensors"


def store_clouds(
    clouds_dir: Path,
    clouds: Sequence[tuple[torch.Tensor, torch.Tensor]],
    probe: ProbeSpec,
    width: int,
    sample: TokenSample,
) -> None:
    """Write every layer's clouds, probed with ``probe`` at the tokens of ``sample`` (in windows
    of ``probe.calibration_split``), then meta.json: what :func:`clouds_problem` checks the files
    against (the layer count, the rows and the width; the files' digests) and how they were
    probed."""
    from safetensors.torch import save_file

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
    meta = {
        "layers": len(clouds),
        "tokens": probe.tokens * probe.replicates,
        **replicates,
        "width": width,
        "site": probe.site,
        "split": probe.calibration_split,
        "windows": [int(w) for w in sample.windows],
        "digests": digests,
    }
    atomic_write_json(clouds_dir / PROBE_META_FILE, meta)


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
