"""A training run's identity: what makes two runs the same experiment, and how a session computed.

The fingerprint is recorded in every checkpoint and in ``result.json``; a training directory
refuses to resume or reuse a run of another fingerprint. Its train settings are the
:class:`~geospec.spec.sections.TrainSpec` fields marked ``FINGERPRINT`` (an entry each) and
``OPTIMIZER`` (one list, in field order); one also marked ``ADDED_LATER`` is left out while it
has its default, so fingerprints recorded before it existed still match. The step count is the
run's own (the spec's, or an override such as the reference's ``train_steps``). The execution
record says how a session computed (device, threads, processes, precision, compilation, torch):
not part of the experiment, but what decides the order of floating-point sums.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch

from geospec.engine.model import GPTConfig
from geospec.engine.token_data import TokenData
from geospec.errors import UsageError
from geospec.spec.sections import AddedLater, Fingerprinted, TrainSpec, marked

__all__ = ["check_same_run", "execution", "fingerprint", "weights_digest"]


def fingerprint(
    train: TrainSpec,
    config: GPTConfig,
    data: TokenData,
    seed: int,
    steps: int,
    initial: dict[str, torch.Tensor] | None = None,
    teacher: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What makes two runs the same experiment (a directory refuses to mix different ones).
    ``initial``: the starting weights of a fine-tuned model (their digest); ``teacher``: the
    identity of the model it distils from (:meth:`geospec.engine.distill.Teacher.identity`);
    each absent otherwise, so fingerprints of earlier runs stay equal."""
    fields = marked(type(train), Fingerprinted)
    later = marked(type(train), AddedLater)
    # as JSON sees them (betas a list), which is how checkpoints and result.json hold them
    settings = train.model_dump(mode="json", include=set(fields))
    found: dict[str, Any] = {
        "config": config.to_dict(),
        "data": data.key,
        "tokens": data.digests,
        "seed": seed,
        "steps": steps,
    }
    for name, marker in fields.items():
        if name in later and getattr(train, name) == type(train).model_fields[name].default:
            continue  # an option added later, at its default: fingerprints from before hold
        if marker.group is None:
            found[name] = settings[name]
        else:
            found.setdefault(marker.group, []).append(settings[name])
    if initial is not None:
        found["initial"] = weights_digest(initial)
    if teacher is not None:
        found["teacher"] = teacher
    return found


def execution(device: torch.device, bf16: bool, processes: int, compiled: bool) -> dict[str, Any]:
    """How this session of a run computes: not part of the experiment (its fingerprint), but what
    decides the order of floating-point sums, so the same run under another setting (CPU threads
    above all) ends at a loss that differs in the third or fourth decimal."""
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "processes": processes,
        "precision": "bf16" if bf16 else "fp32",
        "compiled": compiled,
        "torch": torch.__version__,
    }


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """A content hash of a state dict (names, shapes, dtypes and bytes)."""
    h = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        h.update(tensor.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def check_same_run(out_dir: Path, stored: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse (one line) a directory whose recorded fingerprint ``stored`` is not ``wanted``."""
    if "tokens" not in stored:  # recorded before geospec hashed the tokens: compare the rest
        wanted = {k: v for k, v in wanted.items() if k != "tokens"}
    if stored != wanted:
        differing = sorted(
            k for k in wanted.keys() | stored.keys() if stored.get(k) != wanted.get(k)
        )
        raise UsageError(
            f"{out_dir} holds a run with different settings ({', '.join(differing)}); delete it or "
            "train into another directory"
        )
