"""What the machine computes with: its CPU threads and the precision forward passes run in
(``compute_dtype``, docs/engine.md "Compute dtype and threads"). Torch-free, so that
``geospec validate`` says what a spec will compute in without importing torch.

Why autocast and not bf16 weights: on SmolLM2-135M cut to uneven widths, float32 weights under
bf16 autocast moved a pruned model's held-out loss 3-4x less than the same model with its
weights cast to bf16 (the residual stream and the norms stay float32), at nearly the same speed
on a CPU with AVX512_BF16 (benchmarks/forward.py). The weights stay in the dtype they were loaded
in (``reference.dtype``), so exports are exact and ``reference.dtype = "bfloat16"`` remains the
way to halve the memory.
"""

from __future__ import annotations

import os
from pathlib import Path

from geospec.errors import UsageError

#: The values of a ``compute_dtype`` field ([probe], [diagnose], [demand], [prune]).
COMPUTE_DTYPES = ("auto", "float32", "bfloat16", "float16")

#: /proc/cpuinfo flags of an x86 CPU that computes bf16 dot products natively (AVX512_BF16's
#: vdpbf16ps, AMX's tiles), and the feature of an Arm one (FEAT_BF16).
_BF16_FLAGS = {"avx512_bf16", "amx_bf16"}
_ARM_BF16 = "bf16"


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, what a container or taskset
    allows; not the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_threads(threads: int | None, option: str = "--threads") -> int:
    """``threads`` checked against the cores this process has (None: all of them)."""
    cores = available_cores()
    if threads is None:
        return cores
    if not 1 <= threads <= cores:
        raise UsageError(
            f"{option} {threads}: give 1 to {cores} (the cores this process may use); to share "
            "the machine, give each job its share"
        )
    return threads


def cpu_computes_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512_BF16 or AMX on x86, FEAT_BF16 on
    Arm), read from the kernel's CPU flags; False where they cannot be read (another OS)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            flags = set(value.split())
            return bool(flags & _BF16_FLAGS) or _ARM_BF16 in flags
    return False


def cuda_computes_bf16() -> bool:
    """Whether the first CUDA device computes bfloat16 natively (Ampere and later)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def resolve_compute_dtype(
    requested: str, device_type: str, weights: str, field: str, native_bf16: bool | None = None
) -> tuple[str, str | None]:
    """The dtype forward passes compute in, and a warning (None: nothing to say).

    ``requested`` is a ``compute_dtype`` value; ``device_type`` "cpu" or "cuda"; ``weights`` the
    dtype the model is loaded in (``reference.dtype``): a model loaded in bfloat16 or float16
    computes in it (the other narrow dtype is refused). "auto" is bfloat16 where the hardware
    computes it natively and float32 elsewhere. float16 on a CPU is refused (slower than
    float32 there and less exact); bfloat16 on a CPU without native support is computed, with
    a warning that says what it costs (a result from a machine that has it can then be
    reproduced).
    ``native_bf16`` overrides what the hardware is read to do (tests)."""
    if requested not in COMPUTE_DTYPES:
        raise UsageError(f"{field}: {requested!r} is not one of {', '.join(COMPUTE_DTYPES)}")
    if weights != "float32":  # reference.dtype asked for its weights and activations
        if requested not in ("auto", "float32", weights):
            raise UsageError(
                f'{field} = "{requested}": the model is loaded in {weights} (reference.dtype) '
                f'and computes in it; remove {field}, or set reference.dtype = "float32"'
            )
        return weights, None
    if native_bf16 is None:
        native_bf16 = cuda_computes_bf16() if device_type == "cuda" else cpu_computes_bf16()
    if requested == "auto":
        return ("bfloat16" if native_bf16 else "float32"), None
    if requested == "float16" and device_type == "cpu":
        raise UsageError(
            f'{field} = "float16": a CPU computes float16 slower than float32 and less exactly; '
            'set "bfloat16" or "float32" (float16 is for GPUs)'
        )
    if requested == "bfloat16" and not native_bf16:
        where = "GPU" if device_type == "cuda" else "CPU (no AVX512_BF16, AMX or FEAT_BF16)"
        return requested, (
            f'{field} = "bfloat16": this {where} does not compute bfloat16 natively: it is '
            'emulated, slower than float32 and less exact; "auto" picks float32 here'
        )
    return requested, None
