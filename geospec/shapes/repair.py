"""What the least-squares repair (``prune.repair = "lstsq"``, :mod:`geospec.prune.repair`)
holds and computes, from the shape alone (torch-free: ``geospec validate`` says it, and refuses
a repair whose moments cannot fit, before anything is loaded).

The repair's memory beyond the model is its float64 moments E[a a^T] (width^2 numbers per
layer, plus the mean): every layer's at once when they come from the unpruned model in one pass
(``inputs = "unpruned"``), one layer's at a time in the sequential walk (which also keeps the
residual stream of every calibration window: windows x seq_len x d_model float32). Each batch
adds a float64 copy of one layer's hidden activations and its product, and each layer's re-fit
the (kept + 1)^2 system, its factor and the d_model x (kept + 1) right-hand side. Its time is
one forward pass over its windows (the sequential walk: about one and a half) and the moments'
products, 2 x tokens x width^2 floating-point operations per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from geospec.storage.disk import size

#: The moments' products per second on the machine this project is developed on (each batch's
#: a^T a in float32, summed in float64: benchmarks/repair.py on SmolLM2-135M, 8k tokens, 2 shared
#: cores, 1.16 TFLOP in 8 s beyond the calibration pass they ride on; rounded down): the rate
#: validate's time estimate assumes.
PRODUCT_RATE = 100e9


@dataclass(frozen=True)
class RepairEstimate:
    """The least-squares repair of one calibration sample, by part (bytes; operations)."""

    moments: int
    """The moments held at once."""
    transient: int
    """A batch's float64 activations and their product, and one layer's re-fit."""
    states: int
    """The sequential walk's residual stream of every window (0 in one pass)."""
    operations: float
    """Floating-point operations of the moments' products (2 x tokens x width^2 per layer)."""
    inputs: str

    @property
    def total(self) -> int:
        return self.moments + self.transient + self.states

    def seconds(self, rate: float = PRODUCT_RATE) -> float:
        return self.operations / rate

    @property
    def shared_by(self) -> str:
        """Whose moments these are: one pass serves every unit of a calibration seed, the walk
        measures each unit's own."""
        return "calibration seed" if self.inputs == "unpruned" else "unit"

    def describe(self) -> str:
        held = "every layer's, one pass" if self.inputs == "unpruned" else "one layer's at a time"
        states = f", residual stream {size(self.states)}" if self.states else ""
        return (
            f"{size(self.total)} beside the model and its forward pass (float64 moments "
            f"{size(self.moments)}: {held}; batch and solve {size(self.transient)}{states}); about "
            f"{self.operations / 1e9:.0f} GFLOP of products per {self.shared_by}, "
            f"{_duration(self.seconds())} at {PRODUCT_RATE / 1e9:.0f} GFLOP/s beside one pass "
            "of the model over its windows"
        )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def moments_bytes(width: int) -> int:
    """The bytes one layer's float64 moments take: E[a a^T] and E[a]."""
    return 8 * (width * width + width)


def repair_estimate(
    n_layers: int,
    width: int,
    d_model: int,
    kept: int,
    windows: int,
    seq_len: int,
    batch_size: int,
    inputs: str,
) -> RepairEstimate:
    """The repair of ``n_layers`` FFNs of ``width`` neurons to ``kept`` from ``windows``
    calibration windows of ``seq_len`` tokens run ``batch_size`` at a time, its moments from
    ``inputs`` ("unpruned" or "sequential")."""
    moments = moments_bytes(width) * (n_layers if inputs == "unpruned" else 1)
    batch_tokens = batch_size * seq_len
    solve = 8 * ((kept + 1) ** 2 * 2 + (width + d_model) * (kept + 1))
    transient = 8 * batch_tokens * width + 8 * width * width + solve
    states = 4 * windows * seq_len * d_model if inputs == "sequential" else 0
    operations = 2.0 * windows * seq_len * width * width * n_layers
    return RepairEstimate(moments, transient, states, operations, inputs)
