"""Run-directory files of one training run, and checkpoints that survive a kill at any moment.

- ``config.json``: the :class:`~geospec.engine.model.GPTConfig`.
- ``model.safetensors``: the weights (tied ``lm_head.weight`` stored once, as ``wte.weight``), with
  the step in the file's metadata.
- ``trainer_state.pt``: step, optimizer state (keyed by parameter name), RNG states, timing, last
  validation loss and the run's fingerprint. Read with ``torch.load(weights_only=True)``: no
  arbitrary objects are ever unpickled.
- ``result.json``: written last; its presence means the run is finished. It records the final
  weights' content hash, checked whenever the model is loaded.

Every checkpoint records content hashes of its weights file and of the optimizer state; a resume
checks them, so weights or optimizer state changed behind geospec's back (a zeroed file with an
intact header, a truncated file) are found (:class:`DamagedCheckpoint`) instead of trained on.

A checkpoint is two files, each replaced atomically. To keep them a consistent pair the previous
weights are kept (hard link) as ``model.prev.safetensors`` until the new trainer state is in
place; resuming picks whichever weights file carries the trainer state's step.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from geospec.engine.model import GPT, GPTConfig
from geospec.engine.run_files import (
    CONFIG_FILE,
    METRICS_FILE,
    MODEL_FILE,
    PREVIOUS_MODEL_FILE,
    RESULT_FILE,
    STATE_FILE,
)
from geospec.errors import GeospecError, UsageError
from geospec.storage.atomic import atomic_path, atomic_write_json
from geospec.storage.digests import file_digest
from geospec.storage.disk import writing

TIED_KEY = "lm_head.weight"


class DamagedCheckpoint(GeospecError):
    """A checkpoint or weights file that cannot be read or does not match its recorded hash."""


def tensor_digest(value: Any) -> str:
    """A content hash of nested dicts and lists of tensors and plain values (optimizer state)."""
    digest = hashlib.blake2b(digest_size=16)

    def feed(item: Any, where: str) -> None:
        if isinstance(item, torch.Tensor):
            tensor = item.detach().to("cpu").contiguous().reshape(-1)
            digest.update(f"{where}:{item.dtype}:{tuple(item.shape)}".encode())
            digest.update(tensor.view(torch.uint8).numpy().tobytes())
        elif isinstance(item, dict):
            for key in sorted(item, key=str):
                feed(item[key], f"{where}/{key}")
        elif isinstance(item, (list, tuple)):
            for index, element in enumerate(item):
                feed(element, f"{where}/{index}")
        else:
            digest.update(f"{where}={item!r}".encode())

    feed(value, "")
    return f"blake2b:{digest.hexdigest()}"


def write_config(out_dir: Path, config: GPTConfig) -> None:
    atomic_write_json(out_dir / CONFIG_FILE, config.to_dict())


def read_config(out_dir: Path) -> GPTConfig:
    path = out_dir / CONFIG_FILE
    if not path.is_file():
        raise UsageError(f"{out_dir}: no {CONFIG_FILE}; is this a geospec training directory?")
    return GPTConfig.from_dict(json.loads(path.read_text()))


def save_weights(path: Path, state: dict[str, torch.Tensor], config: GPTConfig, step: int) -> None:
    tensors = {
        name: tensor.detach().to("cpu").contiguous()
        for name, tensor in state.items()
        if not (config.tie_embeddings and name == TIED_KEY)
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"step": str(step)})


def weights_step(path: Path) -> int | None:
    """The training step stored in a weights file (None if absent or unreadable)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except (OSError, ValueError, RuntimeError, SafetensorError):
        return None
    step = metadata.get("step")
    return int(step) if step is not None else None


def load_weights(path: Path, config: GPTConfig) -> dict[str, torch.Tensor]:
    try:
        state = load_file(str(path))
    except (OSError, ValueError, RuntimeError, SafetensorError) as error:
        raise DamagedCheckpoint(f"{path}: unreadable ({_reason(error)})") from None
    if config.tie_embeddings:
        state[TIED_KEY] = state["wte.weight"]
    return state


def load_model(out_dir: str | Path, device: str | torch.device = "cpu") -> GPT:
    """The trained model in ``out_dir`` (config.json + model.safetensors), in eval mode."""
    out_dir = Path(out_dir)
    config = read_config(out_dir)
    path = out_dir / MODEL_FILE
    if not path.is_file():
        raise UsageError(f"{out_dir}: no {MODEL_FILE}; the run has not saved weights yet")
    recorded = _recorded_weights_digest(out_dir)
    if recorded is not None and file_digest(path) != recorded:
        raise DamagedCheckpoint(
            f"{path}: its content changed after training finished (it does not match the "
            f"hash in {RESULT_FILE})"
        )
    model = GPT(config)
    model.load_state_dict(load_weights(path, config), strict=True)
    return model.to(device).eval()


def _recorded_weights_digest(out_dir: Path) -> str | None:
    try:
        result = json.loads((out_dir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    checksums = result.get("checksums") if isinstance(result, dict) else None
    return checksums.get(MODEL_FILE) if isinstance(checksums, dict) else None


def weights_checksum(out_dir: Path) -> dict[str, str]:
    """The content hash of a finished run's weights, recorded in its result.json."""
    return {MODEL_FILE: file_digest(out_dir / MODEL_FILE)}


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def write_checkpoint(
    out_dir: Path,
    weights: dict[str, torch.Tensor],
    trainer_state: dict[str, Any],
    config: GPTConfig,
) -> None:
    """Write weights and trainer state of ``trainer_state["step"]`` so a kill never mixes steps."""
    step = int(trainer_state["step"])
    model_path, previous = out_dir / MODEL_FILE, out_dir / PREVIOUS_MODEL_FILE
    previous.unlink(missing_ok=True)
    if model_path.exists():
        try:
            os.link(model_path, previous)
        except OSError:  # file systems without hard links
            with atomic_path(previous) as tmp:
                shutil.copy2(model_path, tmp)
    save_weights(model_path, weights, config, step)
    checksums = {
        "weights": file_digest(model_path),
        "optimizer": tensor_digest(trainer_state.get("optimizer")),
    }
    with atomic_path(out_dir / STATE_FILE) as tmp:
        torch.save({**trainer_state, "checksums": checksums}, tmp)
    previous.unlink(missing_ok=True)


def read_checkpoint(out_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """(weights file, trainer state) of the last complete checkpoint, or None when there is none.

    Raises :class:`DamagedCheckpoint` when the state cannot be read, no weights file matches its
    step, or the weights or optimizer state do not match the hashes the checkpoint recorded.
    """
    state_path = out_dir / STATE_FILE
    if not state_path.is_file():
        return None
    try:
        state: dict[str, Any] = torch.load(state_path, map_location="cpu", weights_only=True)
        step = int(state["step"])
    except (
        OSError,
        ValueError,
        RuntimeError,
        EOFError,
        KeyError,
        TypeError,
        pickle.UnpicklingError,
    ) as error:
        raise DamagedCheckpoint(f"{state_path}: unreadable ({_reason(error)})") from None
    path = next(
        (
            out_dir / n
            for n in (MODEL_FILE, PREVIOUS_MODEL_FILE)
            if weights_step(out_dir / n) == step
        ),
        None,
    )
    if path is None:
        raise DamagedCheckpoint(f"{state_path}: no weights file holds its step {step}")
    checksums = state.get("checksums")  # absent in checkpoints of older geospec versions
    if isinstance(checksums, dict):
        if file_digest(path) != checksums.get("weights"):
            raise DamagedCheckpoint(f"{path}: its content does not match the checkpoint's hash")
        if tensor_digest(state.get("optimizer")) != checksums.get("optimizer"):
            raise DamagedCheckpoint(
                f"{state_path}: the optimizer state does not match the checkpoint's hash"
            )
    return path, state


def truncate_metrics(out_dir: Path, step: int) -> None:
    """Drop metric lines logged after ``step`` (and lines cut by a crash) before resuming."""
    path = out_dir / METRICS_FILE
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and int(row.get("step", 0)) <= step:
            kept.append(json.dumps(row))
    with atomic_path(path) as tmp:
        tmp.write_text("".join(f"{line}\n" for line in kept))


def append_metrics(out_dir: Path, row: dict[str, Any]) -> None:
    # appended, not replaced: a line cut by a full disk or a kill is dropped on resume
    with writing(out_dir / METRICS_FILE), open(out_dir / METRICS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
