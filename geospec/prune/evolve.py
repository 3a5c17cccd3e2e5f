"""The evolutionary search of the allocation (the ``evolve`` schedule), as EvoPress (Sieberling et
al., 2025) runs it: the levels a layer may take, the mutations, the selection in stages, the
stop, and the loop that resumes from the search's sealed state. The schedule plugin holds the
search's settings and hands them here with the :class:`~geospec.kinds.Search` geospec prune gave
it (:class:`Evolution`); what a candidate scores is the fitness's (:mod:`geospec.prune.search`).

Torch-free (``geospec validate`` checks the levels and the start with it before anything is
loaded), and every draw comes from ``(seed, generation)`` alone: a search resumed from its
state after generation g continues and stops as if never interrupted.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from geospec.errors import UsageError

if TYPE_CHECKING:
    from geospec.kinds import Fitness, ModelDims, Search


class StageSettings(Protocol):
    """One selection stage: each candidate left is scored on ``tokens`` calibration tokens (the
    nearest number of whole windows) and the best ``survivors`` go on."""

    @property
    def tokens(self) -> int: ...

    @property
    def survivors(self) -> int: ...


class EvolveSettings(Protocol):
    """What the search is told (the ``evolve`` schedule's params: docs/prune.md)."""

    @property
    def generations(self) -> int: ...

    @property
    def offspring(self) -> int: ...

    @property
    def stages(self) -> Sequence[StageSettings]: ...

    @property
    def step(self) -> int: ...

    @property
    def min_width(self) -> int | None: ...

    @property
    def max_width(self) -> int | None: ...

    @property
    def fitness(self) -> str: ...

    @property
    def seed(self) -> int: ...

    @property
    def kl_top_k(self) -> int | None: ...

    @property
    def patience(self) -> int | None: ...


#: The narrowest and widest a layer may be, and the step a swap moves, in neurons.
Levels = tuple[int, int, int]


class Evolution:
    """The search ``settings`` describe: one level per layer, a level ``step`` multiples of
    neurons. A generation draws ``offspring`` mutations of the parent, each ``min(U{1,3},
    U{1,3})`` swaps (one layer a step down, another a step up, so the budget stays exact; an
    offspring equal to its parent or to another is drawn again), and selects in ``stages``: each
    stage scores the candidates left on freshly drawn calibration windows and keeps the best;
    the parent joins the last stage, scored again, and is replaced only by an offspring that
    beats it there. It runs ``generations`` generations, or with ``patience`` stops once that
    many generations have passed without a better parent on fixed tracked windows."""

    def __init__(self, settings: EvolveSettings) -> None:
        self.settings = settings

    def run(
        self,
        dims: ModelDims,
        scores: Sequence[Sequence[float]],
        start_of: Callable[[], list[int]],
        search: Search,
    ) -> list[int]:
        """The searched widths for ``dims`` (layers of ``len(scores[l])`` neurons), from the
        widths ``start_of`` gives (asked once the levels are checked), resumed from and saved
        to ``search.state`` after every generation."""
        p = self.settings
        pretrained = min(len(layer) for layer in scores)
        if dims.max_width is not None:
            pretrained = min(pretrained, dims.max_width)
        levels = self.levels(dims, pretrained)
        start = start_of()
        self.check_start(start, dims, *levels)
        lumped = {} if p.kl_top_k is None else {"top_k": p.kl_top_k}
        fitness = search.fitness(p.fitness, **lumped)
        draws = self.stage_windows(fitness)
        state = search.state.load() or {}
        parent = [int(w) for w in state.get("parent", start)]
        trajectory: list[dict[str, Any]] = list(state.get("trajectory", []))
        tracking = p.patience is not None
        if (
            sum(parent) != dims.budget
            or len(parent) != len(start)
            or (tracking and "tracked_start" not in state)
        ):
            # a state of another budget (or, with patience, without its tracked start): over
            parent, trajectory = start, []
        tracked = self.tracked_windows(fitness, draws[-1]) if tracking else []
        saved: dict[str, Any] = {"parent": list(parent), "trajectory": trajectory}
        if tracking:
            saved["tracked_start"] = (
                state["tracked_start"] if trajectory else fitness([start], tracked)[0]
            )
        stopped = self.stopped(trajectory, saved.get("tracked_start"))
        while stopped is None:
            step = self.generation(parent, len(trajectory), fitness, draws, levels)
            if tracking:  # the parent on the fixed windows: scored again only when it moved
                last = trajectory[-1]["tracked"] if trajectory else saved["tracked_start"]
                if step["accepted"]:
                    last = fitness([step["widths"]], tracked)[0]
                    step["tokens"] += len(tracked) * fitness.window_tokens
                step["tracked"] = last
            parent = step["widths"]
            trajectory.append(step)
            stopped = self.stopped(trajectory, saved.get("tracked_start"))
            saved |= {"parent": list(parent), "trajectory": trajectory, "stopped": stopped}
            search.state.save(saved)
        if state.get("stopped") != stopped and "stopped" not in saved:  # an older state
            search.state.save(saved | {"stopped": stopped})
        return parent

    def stage_windows(self, fitness: Fitness) -> list[int]:
        """How many calibration windows each stage draws: whole windows, the nearest count to
        the tokens asked (at least one); a window's tokens are model.seq_len - 1 (seq_len with
        a BOS), seldom a round number. Refused (one line naming the stage) beyond those there
        are."""
        draws = []
        for i, stage in enumerate(self.settings.stages):
            window = fitness.window_tokens
            count = max(1, (2 * stage.tokens + window) // (2 * window))
            if count > fitness.windows:
                raise UsageError(
                    f"stages[{i}].tokens: {stage.tokens} tokens need {count} calibration windows "
                    f"of {fitness.window_tokens}, there are {fitness.windows}; lower tokens or "
                    "raise prune.calibration.windows"
                )
            draws.append(count)
        return draws

    def tracked_windows(self, fitness: Fitness, count: int) -> list[int]:
        """The fixed windows a search with ``patience`` scores each new parent on: as many as
        its last stage draws, drawn once from the seed (apart from every generation's draws)."""
        rng = random.Random(f"evolve:{self.settings.seed}:tracked")
        return sorted(rng.sample(range(fitness.windows), count))

    def stopped(
        self, trajectory: Sequence[Mapping[str, Any]], tracked_start: float | None
    ) -> dict[str, Any] | None:
        """Why the search stops after ``trajectory`` (None: it goes on): ``patience``
        generations since the parent was last better on the tracked windows (its first
        generation at the lowest tracked fitness; 0: the start), or the cap of
        ``generations``. A function of the trajectory alone, so a resumed search stops where
        an uninterrupted one does."""
        p, done = self.settings, len(trajectory)
        if p.patience is not None and tracked_start is not None:
            values = [tracked_start, *(float(step["tracked"]) for step in trajectory)]
            best = min(range(len(values)), key=lambda g: (values[g], g))
            if done - best >= p.patience:
                return {
                    "by": "patience",
                    "generation": done,
                    "best_generation": best,
                    "patience": p.patience,
                }
        if done >= p.generations:
            return {"by": "generations", "generation": done}
        return None

    def generation(
        self,
        parent: Sequence[int],
        generation: int,
        fitness: Fitness,
        draws: Sequence[int],
        levels: Levels,
    ) -> dict[str, Any]:
        """Generation ``generation`` (from 0) from ``parent``, its stages drawing ``draws``
        windows each: its record (the kept candidate's fitness on the last stage's windows,
        whether it replaced the parent, the parent after it as ``widths``, the tokens scored).
        Every draw from ``(seed, generation)`` alone: a resumed search repeats it, and another
        fitness scores the same offspring on the same windows."""
        p, parent = self.settings, list(parent)
        rng = random.Random(f"evolve:{p.seed}:{generation}")
        candidates = self.offspring(parent, rng, *levels)
        tokens, best = 0, float("nan")
        for i, (stage, count) in enumerate(zip(p.stages, draws, strict=True)):
            if i == len(p.stages) - 1 and parent not in candidates:
                candidates.append(parent)  # scored again on these windows: no stale value
            windows = sorted(rng.sample(range(fitness.windows), count))
            values = fitness(candidates, windows, base=parent)
            tokens += len(candidates) * count * fitness.window_tokens
            # ties keep the parent (it is replaced only by a better offspring), then order
            ranked = sorted(
                range(len(candidates)),
                key=lambda k: (values[k], candidates[k] != parent, k),
            )
            best = values[ranked[0]]
            candidates = [candidates[k] for k in ranked[: stage.survivors]]
        return {
            "generation": generation + 1,
            "fitness": best,
            "accepted": candidates[0] != parent,
            "widths": list(candidates[0]),
            "tokens": tokens,
        }

    def levels(self, dims: ModelDims, pretrained: int) -> Levels:
        """The narrowest and widest a layer may be, and a step, in neurons (checked), for layers
        of ``pretrained`` neurons."""
        p, m = self.settings, dims.multiple_of
        pretrained = pretrained // m * m
        low = m if p.min_width is None else p.min_width
        high = pretrained if p.max_width is None else p.max_width
        for name, value in (("min_width", low), ("max_width", high)):
            if value % m:
                raise UsageError(f"{name}: {value} is not a multiple of model.multiple_of {m}")
        if high > pretrained:
            raise UsageError(
                f"max_width: {high} exceeds the pretrained width {pretrained}; pruning never "
                "grows a layer"
            )
        mean = dims.budget / dims.n_layers
        if not low <= mean <= high:
            field, value = ("min_width", low) if low > mean else ("max_width", high)
            raise UsageError(
                f"{field}: {value} leaves no allocation of the budget {dims.budget} over "
                f"{dims.n_layers} layers ({mean:g} neurons a layer on average)"
            )
        return low, high, p.step * m

    @staticmethod
    def check_start(start: Sequence[int], dims: ModelDims, low: int, high: int, size: int) -> None:
        """Refuse (one line naming the field) a start the search cannot move from."""
        outside = [(layer, w) for layer, w in enumerate(start) if not low <= w <= high]
        if outside:
            layer, w = outside[0]
            raise UsageError(
                f"start: layer {layer} starts at width {w}, outside min_width..max_width "
                f"({low}..{high}); widen them or start elsewhere"
            )
        if sum(start) != dims.budget:
            raise UsageError(f"start: its widths sum to {sum(start)}, the budget is {dims.budget}")
        if not swaps(start, low, high, size):
            raise UsageError(
                f"step: no layer of {list(start)} can move {size} neurons to another within "
                f"{low}..{high}; lower step or widen min_width..max_width"
            )

    def offspring(
        self, parent: Sequence[int], rng: random.Random, low: int, high: int, size: int
    ) -> list[list[int]]:
        """Up to ``offspring`` distinct mutations of ``parent``, none equal to it (fewer where
        the levels around it hold fewer: a small model's search space)."""
        found: list[list[int]] = []
        tries, wanted = 0, self.settings.offspring
        while len(found) < wanted and tries < 100 * wanted:
            tries += 1
            child = list(parent)
            for _ in range(min(rng.randint(1, 3), rng.randint(1, 3))):
                moves = swaps(child, low, high, size)
                if not moves:
                    break
                down, up = rng.choice(moves)
                child[down] -= size
                child[up] += size
            if child != list(parent) and child not in found:
                found.append(child)
        return found


def swaps(widths: Sequence[int], low: int, high: int, size: int) -> list[tuple[int, int]]:
    """Every (down, up): layer ``down`` can lose ``size`` neurons and another, ``up``, gain
    them within ``low..high``."""
    downs = [layer for layer, w in enumerate(widths) if w - size >= low]
    ups = [layer for layer, w in enumerate(widths) if w + size <= high]
    return [(down, up) for down in downs for up in ups if down != up]
