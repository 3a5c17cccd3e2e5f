"""Training memory per process, estimated from shapes alone (no torch, no model built), and the
memory a device has free.

What one training process holds, by part (the peak, :attr:`MemoryEstimate.total`, holds all
but the checkpoint's copy, or all but the gradients, AdamW's working set and the activations):

- weights: fp32 master copies (bf16 autocast computes in bf16 but keeps fp32 weights);
- gradients: fp32, one per weight;
- AdamW state: two fp32 moments per weight, and while it steps the working set of its
  per-parameter loop (on the CPU: the square root of the second moment and its quotient, two
  fp32 copies of a parameter; CUDA's fused kernel needs none), counted for the largest parameter
  under 32 MiB, whose copies the heap keeps (below);
- activations: what the forward pass of one micro-batch keeps for the backward pass, plus the
  backward pass's own working set (the widest layer's gradients, the logits' gradient);
- checkpoint: writing a checkpoint serialises the weights once more in host memory.

Under FSDP2 the weights, gradients and AdamW state are split across the processes (plus one
block's weights gathered at a time); under DDP every process holds all of them, and DDP keeps
its gradient buckets besides the gradients.

The peak counts the gradients, AdamW's working set and the activations together although they
are never all alive at once (a step's live tensors peak at the end of its forward pass, before
any gradient exists, or in AdamW's step, after the activations are freed): what the peak counts
is the memory the process holds, and glibc's allocator in a long-running process holds about
their sum. Its mmap threshold rises to the largest block freed so far (up to 32 MiB), and below it
tensors come from a heap it keeps: the gradients and AdamW's working set, formed while the
activations are freed and in pieces of other sizes, mostly land beyond the activations' place,
which the next step's activations take again. Blocks of 32 MiB or more (large logits, a large
embedding's gradient or AdamW's copies of it) are mapped and returned when freed; the sum
counts them all the same (but AdamW's copies), an overcount where they are many. Measured on a
weights-heavy model (dims1 in tests/test_memory.py): the live tensors peak at 211-218 MB, the
process at 262-293 MB (a test session's, or fresh ones pinned to a long-running process's
thresholds), the sum here 277 MB. tests/test_memory.py measures real runs' peak memory against
the estimate.

Healing a pruned model (``[prune.heal]``, :func:`healing_memory`) is such a training run inside
the prune's process, which also holds the checkpoint as it loaded it, the pruned model as
imported into the engine (the weights training starts from) and, distilling, the unpruned model
imported as the teacher and a step's distillation tensors (docs/prune.md, "Healing").
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from geospec.errors import UsageError
from geospec.shapes.model_size import Shape, attention_params, count_params, ffn_params, norm_params
from geospec.storage.disk import size


class Batching(Protocol):
    """What :func:`micro_batching` reads of ``[train]`` (a ``TrainSpec``; a protocol, as the
    spec's sections sit above this module)."""

    @property
    def batch_size(self) -> int: ...

    @property
    def micro_batch_size(self) -> int | None: ...


FP32 = 4
BF16 = 2


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one training process needs at its peak, by part (see the module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    optimizer_step: int
    """AdamW's working set while it steps (the module docstring)."""
    activations: int
    checkpoint: int
    micro_batch: int
    precision: str
    processes: int
    sharded: bool

    @property
    def transient(self) -> int:
        """A step's memory beside the weights and AdamW state: its gradients, AdamW's working
        set and a micro-batch's activations, held together (the module docstring says why);
        all are freed before a checkpoint is written."""
        return self.activations + self.gradients + self.optimizer_step

    @property
    def total(self) -> int:
        """The peak: the weights and AdamW state live throughout, with a step's memory or, when
        it is larger, a checkpoint's copy."""
        return self.weights + self.optimizer + max(self.transient, self.checkpoint)

    def describe(self) -> str:
        """One line: the total and its parts."""
        return (
            f"{size(self.total)} (weights {size(self.weights)}, gradients "
            f"{size(self.gradients)}, AdamW {size(self.optimizer)} and "
            f"{size(self.optimizer_step)} as it steps, activations "
            f"{size(self.activations)} at micro-batch {self.micro_batch}, checkpoint "
            f"{size(self.checkpoint)} after the others; "
            f"{self.precision}, {self.setting()})"
        )

    def setting(self) -> str:
        if self.processes == 1:
            return "1 process"
        return f"{self.processes} processes, {'FSDP2' if self.sharded else 'DDP'}"


def training_memory(
    shape: Shape,
    widths: Sequence[int],
    micro_batch: int,
    *,
    bf16: bool = False,
    processes: int = 1,
    sharded: bool = False,
) -> MemoryEstimate:
    """The estimate for training a model of ``shape`` with FFN ``widths``, ``micro_batch``
    sequences of ``shape.seq_len`` tokens per forward pass, on each of ``processes``
    (``sharded``: FSDP2; otherwise DDP, or one process)."""
    params = count_params(shape, widths)
    split = processes if sharded and processes > 1 else 1
    weights = FP32 * params // split
    gradients = FP32 * params // split
    if processes > 1 and not sharded:
        gradients *= 2  # DDP's buckets hold a second copy of the gradients
    if split > 1:  # FSDP2 gathers one block's weights (in the compute precision) at a time
        weights += (BF16 if bf16 else FP32) * _block_params(shape, max(widths))
    optimizer = 2 * FP32 * params // split
    activations = _activations(shape, widths, micro_batch, BF16 if bf16 else FP32)
    return MemoryEstimate(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        # copies of a tensor past glibc's threshold are returned at once, in AdamW's step alone
        optimizer_step=2 * FP32 * largest_parameter(shape, widths, GLIBC_MMAP_MAX * split) // split,
        activations=activations,
        checkpoint=FP32 * params // split,
        micro_batch=micro_batch,
        precision="bf16 autocast" if bf16 else "fp32",
        processes=processes,
        sharded=sharded,
    )


#: Bytes per weight of each dtype a checkpoint is loaded in (``reference.dtype``).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

#: The float32 tensors of batch x seq_len x vocabulary alive at a distillation step's peak
#: beyond a plain step's: the teacher's logits and the KL divergence's log-softmaxes and
#: elementwise terms (:func:`geospec.engine.distill.kl_per_token`). Measured on the engine: a
#: step's peak is 8 such tensors with distillation, 4 without (tests/test_memory.py).
DISTILLATION_LOGITS = 4


@dataclass(frozen=True)
class HealingEstimate:
    """Bytes the prune's process holds at its peak while it heals one pruned model, by part."""

    training: MemoryEstimate
    """The pruned model's training: its weights, gradients, AdamW state, a batch's activations."""
    imported: int
    """The pruned model imported into the engine: the weights training starts from."""
    teacher: int
    """Distilling: the unpruned model imported into the engine (float32)."""
    distillation: int
    """Distilling: a step's tensors beside the student's (:data:`DISTILLATION_LOGITS`)."""
    reference: int
    """The checkpoint as the prune loaded it (``reference.dtype``), held throughout."""

    @property
    def total(self) -> int:
        """The training's peak with the distillation's tensors (counted with a step's
        activations and gradients) and the weights held beside it."""
        t = self.training
        transient = max(t.transient + self.distillation, t.checkpoint)
        held = self.imported + self.teacher + self.reference
        return t.weights + t.optimizer + transient + held

    def describe(self) -> str:
        """One line: the total and its parts."""
        t = self.training
        distilled = (
            f"teacher {size(self.teacher)}, distillation {size(self.distillation)}, "
            if self.teacher
            else ""
        )
        return (
            f"{size(self.total)} (pruned model {size(t.weights)}, gradients {size(t.gradients)}, "
            f"AdamW {size(t.optimizer)} and {size(t.optimizer_step)} as it steps, activations "
            f"{size(t.activations)} at batch "
            f"{t.micro_batch}, {distilled}the pruned model as imported {size(self.imported)}, "
            f"the checkpoint as loaded {size(self.reference)}; {t.precision}, {t.setting()})"
        )


def healing_memory(
    shape: Shape,
    widths: Sequence[int],
    pruned: Sequence[int],
    batch: int,
    *,
    checkpoint_bytes: int,
    distill: bool,
    bf16: bool = False,
) -> HealingEstimate:
    """The estimate for healing the model of ``shape`` with FFN ``widths``, pruned to the FFN
    widths ``pruned``, on ``batch`` sequences of ``shape.seq_len`` tokens a step (healing takes
    them in one forward pass), the checkpoint loaded in ``checkpoint_bytes`` per weight;
    ``distill``: from the unpruned model (``heal.distill`` > 0)."""
    training = training_memory(shape, pruned, batch, bf16=bf16)
    logits = batch * shape.seq_len * shape.vocab_size * FP32
    params = count_params(shape, widths)
    return HealingEstimate(
        training=training,
        imported=FP32 * count_params(shape, pruned),
        teacher=FP32 * params if distill else 0,
        distillation=DISTILLATION_LOGITS * logits if distill else 0,
        reference=checkpoint_bytes * params,
    )


#: glibc's largest mmap threshold (64-bit): an allocation of this size or more is mapped on its
#: own and returned when freed, in any process; below it a long-running process's heap keeps it.
GLIBC_MMAP_MAX = 32 << 20


def largest_parameter(shape: Shape, widths: Sequence[int], below: int | None = None) -> int:
    """Elements of the model's largest parameter tensor (of those under ``below`` bytes in
    float32), as the engine lays them out: the token embedding (an untied head the same), learned
    positions, the fused query-key-value projection, the attention's output, an FFN's input
    projection (swiglu's gate and up fused) or its output, a norm."""
    d = shape.d_model
    rows = [shape.vocab_size, d + 2 * shape.kv_width, d, 1]
    if shape.positions == "learned":
        rows.append(shape.seq_len)
    for width in set(widths):
        rows += [2 * width if shape.activation == "swiglu" else width, width]
    sizes = [d * count for count in rows]
    return max((n for n in sizes if below is None or FP32 * n < below), default=0)


def _block_params(shape: Shape, width: int) -> int:
    d = shape.d_model
    return (
        2 * norm_params(d, shape.norm, shape.bias)
        + attention_params(d, shape.bias, shape.kv_width)
        + ffn_params(d, width, shape.activation, shape.bias)
    )


def _layer_activations(shape: Shape, width: int, tokens: int, compute: int) -> int:
    """Bytes one decoder layer keeps for the backward pass: the fp32 residual stream and norm
    outputs, and in the compute precision the attention's q, k, v and output, and the FFN's
    hidden layer before and after its activation (swiglu: gate, up, their activation, product)."""
    d, kv = shape.d_model, shape.kv_width
    residual = FP32 * 4 * d  # each norm's input and output
    attention = compute * (d + 2 * kv + 2 * d) + FP32 * shape.n_heads  # q k v, out, proj; lse
    hidden = compute * width * (4 if shape.activation == "swiglu" else 2)
    return tokens * (residual + attention + hidden)


def saved_activations(shape: Shape, widths: Sequence[int], micro_batch: int, compute: int) -> int:
    """Bytes a forward pass of ``micro_batch`` sequences keeps for the backward pass: every
    layer's (:func:`_layer_activations`) and the loss's fp32 log-softmax over the vocabulary."""
    tokens = micro_batch * shape.seq_len
    layers = sum(_layer_activations(shape, w, tokens, compute) for w in widths)
    return layers + tokens * shape.vocab_size * FP32


def _activations(shape: Shape, widths: Sequence[int], micro_batch: int, compute: int) -> int:
    """The saved activations, the logits (held until the step ends; with bf16 also their fp32
    copy) and the backward pass's working set: the fp32 gradients of the log-softmax and of the
    logits, and the widest layer's gradients while they are formed."""
    tokens = micro_batch * shape.seq_len
    logits = tokens * shape.vocab_size * (compute + (FP32 if compute != FP32 else 0))
    backward = tokens * shape.vocab_size * 2 * FP32
    backward += _layer_activations(shape, max(widths), tokens, compute)
    return saved_activations(shape, widths, micro_batch, compute) + logits + backward


def micro_batching(train: Batching, world_size: int) -> tuple[int, int]:
    """(sequences per micro-batch, micro-batches per step) on each process."""
    if train.batch_size % world_size:
        raise UsageError(
            f"train.batch_size {train.batch_size} is not divisible by the {world_size} processes"
        )
    per_rank = train.batch_size // world_size
    micro = min(train.micro_batch_size or per_rank, per_rank)
    if per_rank % micro:
        raise UsageError(
            f"train.micro_batch_size {micro} does not divide the {per_rank} sequences each of the "
            f"{world_size} processes takes per step; choose a divisor of {per_rank}"
        )
    return micro, per_rank // micro


#: What allocators say when they refuse: PyTorch's CPU allocator and CUDA's caching allocator.
OUT_OF_MEMORY_WORDS = ("can't allocate memory", "out of memory", "cannot allocate memory")


def says_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation refused (``MemoryError``, torch's
    ``OutOfMemoryError``, or a ``RuntimeError`` in an allocator's words)."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(w in text for w in OUT_OF_MEMORY_WORDS)


def advice(shape: Shape, widths: Sequence[int], estimate: MemoryEstimate) -> str:
    """The settings that lower ``estimate``, each with what the model would need then."""

    def need(micro_batch: int | None = None, bf16: bool | None = None, fsdp: int = 0) -> str:
        changed = training_memory(
            shape, widths, estimate.micro_batch if micro_batch is None else micro_batch,
            bf16=estimate.precision != "fp32" if bf16 is None else bf16,
            processes=fsdp or estimate.processes, sharded=bool(fsdp) or estimate.sharded,
        )  # fmt: skip
        return size(changed.total)

    tips = []
    if estimate.micro_batch > 1:
        now = estimate.micro_batch
        tips.append(f"lower train.micro_batch_size (now {now}; at 1: {need(micro_batch=1)})")
    if estimate.precision == "fp32":
        tips.append(f'set train.precision = "bf16" ({need(bf16=True)})')
    if not estimate.sharded:
        tips.append(
            'train under torchrun with train.distributed = "fsdp2" (weights, gradients and AdamW '
            f"state split across the processes; on 8: {need(fsdp=8)})"
        )
    tips.append("make the model smaller")
    return "; ".join(tips)


def memory_refusal(
    shape: Shape, widths: Sequence[int], estimate: MemoryEstimate, free: int, device: str
) -> str | None:
    """Why a model cannot be trained where ``free`` bytes are left on ``device`` (one line,
    with what helps), or None when its estimate fits."""
    if estimate.total <= free:
        return None
    return (
        f"needs about {estimate.describe()} per process, and {device} has {size(free)} free; "
        + advice(shape, widths, estimate)
    )


# ---------------------------------------------------------------------------------------------
# the memory a device has free


def host_available() -> int | None:
    """Bytes this process can still allocate on the host: the least of the kernel's
    MemAvailable, the cgroup's limit less its use, and the address-space limit (``ulimit -v``)
    less what this process has mapped already; None when none of them can be read."""
    limits = [_meminfo_available(), _cgroup_room(), _address_space_room()]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    found = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def _cgroup_room() -> int | None:
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        used = int((base / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


def _address_space_room() -> int | None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        status = Path(f"/proc/{os.getpid()}/status").read_text()
    except OSError:
        return soft
    found = re.search(r"^VmSize:\s+(\d+) kB", status, re.MULTILINE)
    mapped = int(found.group(1)) * 1024 if found else 0
    return max(soft - mapped, 0)
