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

An ``evolve`` search over repaired levels holds every layer's moments from one pass (whatever
``inputs`` the winner is repaired from) and the re-fits of the levels it has visited, at most
:data:`LEVEL_CACHE_BYTES` (:func:`levels_bytes`); each level it visits first costs a solve
(:func:`level_operations`).
"""

from __future__ import annotations

from dataclasses import dataclass

from geospec.storage.disk import size

#: The moments' products per second on the machine this project is developed on (each batch's
#: a^T a in float32, summed in float64: benchmarks/repair.py on SmolLM2-135M, 8k tokens, 2 shared
#: cores, 1.16 TFLOP in 8 s beyond the calibration pass they ride on; rounded down): the rate
#: validate's time estimate assumes.
PRODUCT_RATE = 100e9

#: The most bytes a search keeps of its repaired levels' re-fits
#: (:class:`geospec.prune.search.RepairedLevels`): beyond it the least recently used are dropped
#: and, visited again, solved again (the same numbers). 1 GiB holds about 20 of SmolLM2-135M's
#: levels in every layer at keep 1/2 (a level there: 576 x 768 float32); a replayed
#: 150-generation search visited about 7 a layer, 368 MiB (``benchmarks/search.py --levels-only``).
LEVEL_CACHE_BYTES = 2**30

#: Float64 operations per second of a level's solve (the right-hand side's product and the
#: Cholesky solve), on the machine this project is developed on (``benchmarks/search.py
#: --levels-only`` on SmolLM2-135M, 2 cores shared with a study: median 87 ms, 25 GFLOP/s, the
#: slowest layer 200 ms; rounded down to the slowest): the rate validate's estimate assumes.
SOLVE_RATE = 10e9


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
    levels: int = 0
    """What a search over repaired levels keeps of them, at most (0: no search)."""
    level_operations: float = 0.0
    """The float64 operations of one level's solve, at the widest kept width."""

    @property
    def total(self) -> int:
        return self.moments + self.transient + self.states + self.levels

    def seconds(self, rate: float = PRODUCT_RATE) -> float:
        return self.operations / rate

    @property
    def shared_by(self) -> str:
        """Whose moments these are: one pass serves every unit of a calibration seed, the walk
        measures each unit's own."""
        return "calibration seed" if self.inputs == "unpruned" else "unit"

    def describe(self) -> str:
        held = (
            "every layer's, one pass"
            if self.inputs == "unpruned" or self.levels
            else "one layer's at a time"
        )
        states = f", residual stream {size(self.states)}" if self.states else ""
        levels = f", the search's repaired levels {size(self.levels)}" if self.levels else ""
        solves = (
            f"; the search solves each level it visits once, up to "
            f"{self.level_operations / 1e9:.1f} GFLOP ({self.level_operations / SOLVE_RATE:.2f} s "
            f"at {SOLVE_RATE / 1e9:.0f} GFLOP/s)"
            if self.levels
            else ""
        )
        return (
            f"{size(self.total)} beside the model and its forward pass (float64 moments "
            f"{size(self.moments)}: {held}; batch and solve {size(self.transient)}{states}"
            f"{levels}); about {self.operations / 1e9:.0f} GFLOP of products per "
            f"{self.shared_by}, {_duration(self.seconds())} at {PRODUCT_RATE / 1e9:.0f} GFLOP/s "
            f"beside one pass of the model over its windows{solves}"
        )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def moments_bytes(width: int) -> int:
    """The bytes one layer's float64 moments take: E[a a^T] and E[a]."""
    return 8 * (width * width + width)


def levels_bytes(n_layers: int, width: int, d_model: int, multiple: int) -> int:
    """The bytes a search's repaired levels can take: the float32 re-fit (d_model x kept) and
    float64 bias of every width, in multiples of ``multiple`` below ``width``, of every layer,
    at most :data:`LEVEL_CACHE_BYTES`."""
    kept = range(multiple, width, multiple)
    every = n_layers * sum(4 * d_model * k + 8 * d_model for k in kept)
    return min(every, LEVEL_CACHE_BYTES)


def level_operations(width: int, d_model: int, kept: int) -> float:
    """A level's solve at ``kept`` of ``width`` neurons, in float64 operations: the right-hand
    side W [H[:, K], mu] (2 d_model width kept), the Cholesky factor (kept^3 / 3) and its solve
    for d_model right-hand sides (2 d_model kept^2)."""
    return 2.0 * d_model * width * kept + kept**3 / 3 + 2.0 * d_model * kept**2


def repair_estimate(
    n_layers: int,
    width: int,
    d_model: int,
    kept: int,
    windows: int,
    seq_len: int,
    batch_size: int,
    inputs: str,
    search_multiple: int | None = None,
) -> RepairEstimate:
    """The repair of ``n_layers`` FFNs of ``width`` neurons to ``kept`` from ``windows``
    calibration windows of ``seq_len`` tokens run ``batch_size`` at a time, its moments from
    ``inputs`` ("unpruned" or "sequential"); with ``search_multiple``, beside it an ``evolve``
    search over repaired levels ``search_multiple`` neurons apart (the moments of one pass and
    the levels' re-fits held)."""
    one_pass = inputs == "unpruned" or search_multiple is not None
    moments = moments_bytes(width) * (n_layers if one_pass else 1)
    batch_tokens = batch_size * seq_len
    solve = 8 * ((kept + 1) ** 2 * 2 + (width + d_model) * (kept + 1))
    transient = 8 * batch_tokens * width + 8 * width * width + solve
    states = 4 * windows * seq_len * d_model if inputs == "sequential" else 0
    operations = 2.0 * windows * seq_len * width * width * n_layers
    if search_multiple is None:
        return RepairEstimate(moments, transient, states, operations, inputs)
    levels = levels_bytes(n_layers, width, d_model, search_multiple)
    widest = level_operations(width, d_model, width - search_multiple)
    return RepairEstimate(moments, transient, states, operations, inputs, levels, widest)
