"""The searches of the allocation on the calibration text of the model being pruned: greedy
(the best single cut at each move) and evolve (EvoPress's evolutionary search)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from geospec.errors import UsageError
from geospec.kinds import (
    CutLosses,
    ModelDims,
    Schedule,
    ScoreAllocation,
    Search,
    reads_scores,
)
from geospec.plugin import (
    ADDED_LATER,
    ScheduleRef,
    create_plugin,
)

from .derived import ArmName
from .scores import NeuronScoreParams
from .tapers import Uniform


class Greedy(ScoreAllocation):
    """A search on the calibration loss, the headroom every heuristic allocation is measured
    against: from every layer at its pretrained width (rounded down to a multiple), remove
    ``step`` multiples (the last move: what is left) from the layer whose cut raises the
    calibration loss least, until the budget is met; ties go to the lower layer. The losses are
    the mean next-token loss on the prune's calibration windows (the training split, never eval
    text), each layer keeping its best neurons by the arm's importance, without compensation
    (:class:`~geospec.kinds.CutLosses`; geospec prune computes a move from the cut layer on).

    What it guarantees: every move is the best single move from where it stands, so its widths
    score no worse than any other last move from its own second-to-last widths. It guarantees
    nothing against uniform or any other allocation (a greedy path can end worse than one cut
    it never walked towards), and it costs one calibration pass per layer per move (coarser
    ``step``, fewer moves)."""

    reads_cut_losses = True

    class Params(NeuronScoreParams):
        kind: Literal["greedy"] = "greedy"
        step: int = Field(1, ge=1, le=100_000)
        """Multiples of model.multiple_of removed per move."""

    params: Params

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        raise UsageError(
            "'greedy' searches on the calibration loss of the model being pruned, which geospec "
            "prune gives it"
        )

    def widths_from_losses(
        self, dims: ModelDims, scores: Sequence[Sequence[float]], losses: CutLosses
    ) -> list[int]:
        m = dims.multiple_of
        widths = [min(len(layer), dims.max_width or len(layer)) // m * m for layer in scores]
        excess = sum(widths) - dims.budget
        if excess < 0 or excess % m or len(widths) != dims.n_layers:
            raise UsageError(
                f"greedy: {len(widths)} layers of at most {widths} neurons cannot keep the budget "
                f"{dims.budget} of {dims.n_layers} layers in multiples of {m}"
            )
        while excess > 0:
            size = min(self.params.step * m, excess)
            moves = [(layer, w - size) for layer, w in enumerate(widths) if w - size >= m]
            if not moves:
                raise UsageError(f"greedy: no layer can lose {size} more neurons from {widths}")
            values = losses(widths, moves)
            best = min(range(len(moves)), key=lambda i: (values[i], moves[i][0]))
            layer, width = moves[best]
            widths[layer] = width
            excess -= size
        return widths


class EvolveStage(BaseModel):
    """One selection stage of ``evolve``: every candidate left is scored on ``tokens``
    calibration tokens (the nearest number of whole windows, freshly drawn), and the best
    ``survivors`` go on."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tokens: int = Field(ge=1, le=100_000_000)
    """Calibration tokens each candidate is scored on (rounded to whole windows, at least one)."""
    survivors: int = Field(ge=1, le=10_000)
    """How many candidates go on to the next stage (1 in the last: the one that may replace
    the parent)."""


def _default_stages() -> list[EvolveStage]:
    # about 10k scored tokens a generation, about 10 s on 2 cores for SmolLM2-135M: 16 x 256 on
    # the first stage (EvoPress's first stage gave the same result from 64 to 1,024 tokens), 2
    # offspring and the parent on 2048
    return [EvolveStage(tokens=256, survivors=2), EvolveStage(tokens=2048, survivors=1)]


class Evolve(ScoreAllocation):
    """An evolutionary search of the allocation on the calibration text, as EvoPress
    (Sieberling et al., 2025) runs it: one level per layer, a level ``step`` multiples of
    neurons, the layer keeping its best neurons by the arm's importance at every level (nested
    levels), repaired as the arm's ``repair`` says (mean compensation, or the least-squares
    re-fit from the unpruned model's inputs, each level solved once; the winner is then
    repaired as the arm says, sequentially where it says so). A generation draws
    ``offspring`` mutations of the parent, each ``min(U{1,3}, U{1,3})`` swaps (one layer a step
    down, another a step up, so the budget stays exact; an offspring equal to its parent or to
    another is drawn again), and selects in ``stages``: each stage scores the candidates left
    on freshly drawn calibration windows and keeps the best; the parent joins the last stage,
    scored again, and is replaced only by an offspring that beats it there. The fitness is the
    mean per-token KL divergence from the unpruned model's next-token distribution (or the
    calibration loss), on the prune's calibration windows (training split, never eval text):
    :class:`~geospec.kinds.Search`.

    It starts from ``start`` (a schedule that needs no profile, score or arm: uniform,
    protect, a taper, manual) or from the widths of any other prune arm (``start_arm``: a
    geometric arm, protect-ends, flap, an owl setting, another search). It runs ``generations``
    generations, or with ``patience`` stops once that many generations have passed without a
    better parent on fixed tracked windows. Generation g draws from ``(seed, g)`` alone and the
    stop is a function of the trajectory, so a search resumed from its state after generation
    g continues and stops as if never interrupted.

    This class holds the search's settings and checks them; the search itself is
    :class:`geospec.prune.evolve.Evolution`."""

    reads_search = True

    class Params(NeuronScoreParams):
        kind: Literal["evolve"] = "evolve"
        start: ScheduleRef = Field(default_factory=Uniform.Params)
        """The allocation the search starts from: a schedule table that reads no profile,
        neuron score or arm (uniform, protect, a taper, manual)."""
        start_arm: ArmName | None = None
        """Start from this other prune arm's widths instead (any arm: a geometric arm,
        protect-ends, flap, an owl setting, another search; not a grid's name)."""
        generations: int = Field(150, ge=1, le=1_000_000)
        """Generations of the search."""
        offspring: int = Field(16, ge=1, le=10_000)
        """Mutations of the parent drawn each generation."""
        stages: list[EvolveStage] = Field(default_factory=_default_stages, min_length=1)
        """The selection stages, in order (the last keeps 1 survivor)."""
        step: int = Field(1, ge=1, le=100_000)
        """A level, in multiples of model.multiple_of: what a swap moves between two layers."""
        min_width: int | None = Field(None, ge=1)
        """The narrowest a layer may become, in neurons (default: one multiple)."""
        max_width: int | None = Field(None, ge=1)
        """The widest a layer may become, in neurons (default: the pretrained width)."""
        fitness: Literal["kl", "loss"] = "kl"
        """What a candidate is scored by: the mean per-token KL divergence from the unpruned
        model's next-token distribution, or the mean next-token loss."""
        seed: int = Field(0, ge=0)
        """Seeds the mutations and the windows each stage draws."""
        kl_top_k: Annotated[int | None, ADDED_LATER, Field(ge=1, le=1_000_000)] = None
        """The KL fitness over the unpruned model's ``kl_top_k`` most likely tokens at each
        position, every other token lumped into one bucket (cheaper over a large vocabulary,
        and its teacher kept as those tokens alone); default: the whole vocabulary."""
        patience: Annotated[int | None, ADDED_LATER, Field(ge=1, le=1_000_000)] = None
        """Stop after this many generations without a better parent on the tracked windows
        (fixed windows, drawn once from the seed, on which every new parent is scored);
        default: no early stop, every one of ``generations`` runs and nothing is tracked."""

        @field_validator("stages")
        @classmethod
        def _narrowing(cls, stages: list[EvolveStage]) -> list[EvolveStage]:
            counts = [stage.survivors for stage in stages]
            if counts[-1] != 1:
                raise ValueError(
                    f"the last stage keeps {counts[-1]} survivors; it keeps 1 (the candidate "
                    "that may replace the parent)"
                )
            if any(b > a for a, b in itertools.pairwise(counts)):
                raise ValueError(f"survivors must not grow from stage to stage, got {counts}")
            return stages

        @model_validator(mode="after")
        def _one_start(self) -> Evolve.Params:
            # start's default (uniform) beside start_arm: the table read back from its dump
            if self.start_arm is not None and self.start != Uniform.Params():
                raise ValueError("give start or start_arm, not both")
            if self.kl_top_k is not None and self.fitness != "kl":
                raise ValueError(
                    f"kl_top_k lumps the KL's tail, and fitness is {self.fitness!r}: drop "
                    'kl_top_k or set fitness = "kl"'
                )
            if self.stages[0].survivors > self.offspring:
                raise ValueError(
                    f"stages[0].survivors {self.stages[0].survivors} exceeds offspring "
                    f"{self.offspring}"
                )
            return self

    params: Params

    def required_arms(self) -> list[str]:
        return [] if self.params.start_arm is None else [self.params.start_arm]

    def start_schedule(self) -> Schedule:
        schedule: Schedule = create_plugin("schedule", self.params.start)
        return schedule

    def check(self, dims: ModelDims) -> list[str]:
        from geospec.prune.evolve import Evolution

        problems = self._start_problems(dims)
        if problems or dims.max_width is None:  # no pretrained width: a training arm's dims
            return problems
        # what geospec prune will refuse, said by geospec validate: the levels and the step
        # at the pretrained width (the checkpoint's, as every layer has under prune)
        try:
            evolution = Evolution(self.params)
            low, high, size = evolution.levels(dims, dims.max_width)
            if self.params.start_arm is None:
                start = self.start_schedule().widths_from(dims, {}, {})
                evolution.check_start(start, dims, low, high, size)
        except UsageError as error:
            return [str(error)]
        return []

    def _start_problems(self, dims: ModelDims) -> list[str]:
        """What keeps ``start`` from giving the search its first widths."""
        if self.params.start_arm is not None:
            return []
        start = self.start_schedule()
        kind = start.kind_name()
        if reads_scores(start):
            searched = isinstance(start, ScoreAllocation) and (
                start.reads_search or start.reads_cut_losses
            )
            what = "is a search" if searched else "reads neuron scores"
            return [
                f"start: {kind!r} {what}; list it as its own [[prune.arms]] and name it in "
                "start_arm" + (", or start from uniform" if searched else "")
            ]
        if start.required_profiles() or start.profiles_file() or start.required_arms():
            return [
                f"start: {kind!r} reads profiles or other arms; list it as its own "
                "[[prune.arms]] and name it in start_arm"
            ]
        return start.check(dims)

    def widths_from_scores(self, dims: ModelDims, scores: Sequence[Sequence[float]]) -> list[int]:
        raise UsageError(
            "'evolve' searches on the calibration text of the model being pruned, which geospec "
            "prune gives it"
        )

    def widths_from_search(
        self,
        dims: ModelDims,
        scores: Sequence[Sequence[float]],
        arms: Mapping[str, Sequence[int]],
        search: Search,
    ) -> list[int]:
        from geospec.prune.evolve import Evolution

        def start() -> list[int]:
            if self.params.start_arm is not None:
                return list(arms[self.params.start_arm])
            problems = self._start_problems(dims)
            if problems:
                raise UsageError(problems[0])
            return list(self.start_schedule().widths_from(dims, {}, {}))

        return Evolution(self.params).run(dims, scores, start, search)
