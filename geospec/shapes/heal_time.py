"""How long healing one pruned model takes, from its parameters and a measured rate (torch-free:
``geospec validate`` and the report's "What to ship" say it before anything is trained).

A healing step trains the pruned model (a forward and a backward pass: 6 floating-point
operations per parameter and token) and, distilling, runs the unpruned model forward as its
teacher (2 per parameter and token). Attention's own work grows with the sequence and is left
out (at 256 tokens it is a few percent of a small model's). The rate that turns operations into
seconds was measured on this project's machine: docs/prune.md, "Healing", gives the measurement
and the table it yields.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``geospec heal``'s optimizer steps where neither ``--steps`` nor ``[prune.heal]`` gives any.
DEFAULT_STEPS = 100

#: Operations per second of healing in float32, measured with ``geospec heal`` on
#: SmolLM2-135M-Instruct's Q4_1 file at keep 1/2 (protect-ends, 94.7 M of its 134.5 M
#: parameters: 837 M operations a token), distilled at batch 8 x 256 tokens on this project's 2
#: CPU cores shared with two other prunes: steps 2-4 took 54, 45 and 38 s, 44.8 tokens a second
#: on average (docs/prune.md, "What healing costs").
CPU_FLOPS = 37.5e9

#: Where the rate was measured, as the estimates say it.
CPU_MEASURED = "2 shared CPU cores"

#: The same healing on the same 2 cores with nothing else running: ``geospec heal``'s 100
#: default steps on SmolLM2-135M at keep 1/2 (shift-spherical, 94.7 M parameters, 837 M
#: operations a token) trained its 204,800 tokens in 1,592 s, 128.7 tokens a second
#: (docs/results/smollm2-135m-heal-shipped).
QUIET_CPU_FLOPS = 107.7e9

#: Where the quiet rate was measured.
QUIET_MEASURED = "2 quiet CPU cores"


@dataclass(frozen=True)
class HealingTime:
    """One pruned model's healing: its tokens, operations and the time at :data:`CPU_FLOPS`."""

    steps: int
    batch: int
    seq_len: int
    flops: float

    @property
    def tokens(self) -> int:
        return self.steps * self.batch * self.seq_len

    @property
    def seconds(self) -> float:
        """At :data:`CPU_FLOPS` (cores shared with other work: the longer time)."""
        return self.flops / CPU_FLOPS

    @property
    def quiet_seconds(self) -> float:
        """At :data:`QUIET_CPU_FLOPS` (the same cores with nothing else running)."""
        return self.flops / QUIET_CPU_FLOPS

    def describe(self) -> str:
        """``about 27 min on 2 quiet CPU cores, 76 min on 2 shared CPU cores (100 steps of 8 x
        256 tokens; ...)``."""
        return (
            f"about {duration(self.quiet_seconds)} on {QUIET_MEASURED}, "
            f"{duration(self.seconds)} on {CPU_MEASURED} ({self.steps} steps of "
            f"{self.batch} x {self.seq_len} tokens; a GPU takes a small fraction of it)"
        )


def healing_time(
    pruned: int, unpruned: int, steps: int, batch: int, seq_len: int, *, distill: bool
) -> HealingTime:
    """The healing of a model of ``pruned`` parameters cut from one of ``unpruned``: ``steps``
    steps of ``batch`` sequences of ``seq_len`` tokens, ``distill``: from the unpruned model."""
    per_token = 6 * pruned + (2 * unpruned if distill else 0)
    return HealingTime(steps, batch, seq_len, float(per_token) * steps * batch * seq_len)


def duration(seconds: float) -> str:
    """``40 s``, ``12 min``, ``1.3 h``: a time estimate to the precision it has."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
