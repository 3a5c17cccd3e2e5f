"""The smoother, solver and schedule contract checks (docs/plugins.md): torch-free, like the
kinds they check."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from geospec.errors import GeospecError
from geospec.kinds import (
    ModelDims,
    Schedule,
    ScoreAllocation,
    Smoother,
    Solver,
    WidthProblem,
    reads_scores,
)
from geospec.testing.contract import plugin_instance, rule

#: The model :func:`check_schedule` asks for widths by default: six layers, uniform width 64,
#: widths in multiples of 8.
DIMS = ModelDims(n_layers=6, d_model=32, ffn_width=64, multiple_of=8)


def _profile(n: int, seed: int) -> list[float]:
    """A positive, uneven work profile (seeded)."""
    generator = random.Random(seed)
    return [0.2 + generator.random() for _ in range(n)]


def check_smoother(
    cls: type[Any], params: dict[str, Any] | None = None, lengths: Sequence[int] = (1, 2, 5, 12)
) -> None:
    """Check a ``smoother`` plugin class against its contract (docs/plugins.md) on profiles of
    each length in ``lengths``: a list of finite floats of the same length; non-negative for a
    non-negative profile; a constant profile kept constant; the profile it is given unchanged;
    the same output twice. Raises :class:`~geospec.testing.ContractError` naming the broken
    rule."""
    plugin = plugin_instance(cls, Smoother, params)
    for n in lengths:
        profile = _profile(n, seed=n)
        given = list(profile)
        smoothed = plugin(given)
        rule(
            plugin,
            not isinstance(smoothed, list) or len(smoothed) != n,
            f"a smoothed profile must be a list of the profile's length {n}, got {smoothed!r}",
        )
        rule(
            plugin,
            not all(_is_number(v) and math.isfinite(v) for v in smoothed),
            f"a smoothed profile must hold finite floats, got {smoothed}",
        )
        rule(
            plugin,
            any(v < 0 for v in smoothed),
            f"a non-negative profile must stay non-negative, got {smoothed}",
        )
        rule(plugin, given != profile, "the smoother must not change the profile it is given")
        rule(plugin, plugin(list(profile)) != smoothed, "the same profile must smooth the same")
        constant = plugin([2.5] * n)
        rule(
            plugin,
            not all(math.isclose(v, 2.5, rel_tol=1e-9) for v in constant),
            f"a constant profile must stay constant: [2.5] * {n} became {constant}",
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: The problems :func:`check_solver` solves by default: uneven work, a zero-work layer with a
#: width cap (pruning's), and equal work.
PROBLEMS = (
    WidthProblem(tuple(_profile(6, seed=0)), budget=6 * 64, multiple=8, lower=8, upper=6 * 64),
    WidthProblem((0.0, *_profile(11, seed=1)), budget=12 * 96, multiple=16, lower=16, upper=160),
    WidthProblem((1.0,) * 8, budget=8 * 48, multiple=8, lower=8, upper=8 * 48),
)


def check_solver(
    cls: type[Any],
    params: dict[str, Any] | None = None,
    problems: Sequence[WidthProblem] = PROBLEMS,
) -> None:
    """Check a ``solver`` plugin class against its contract (docs/plugins.md) on each problem:
    one integer width per layer, summing exactly to the budget, each a multiple of
    ``multiple`` within ``[lower, upper]``; its own :meth:`~geospec.kinds.Solver.bounds` inside
    those hard limits (a solver narrows them, never widens them) and every width inside them;
    the same widths twice; and equal work giving every layer the same width (a solver sees
    nothing else of a layer), where the uniform width is a multiple. Raises
    :class:`~geospec.testing.ContractError` naming the broken rule."""
    plugin = plugin_instance(cls, Solver, params)
    for problem in problems:
        widths = plugin.solve(problem)
        limits = (problem.lower, problem.upper)
        bounds = plugin.bounds(problem)
        if bounds is not None:
            rule(
                plugin,
                not (problem.lower <= bounds[0] <= bounds[1] <= problem.upper),
                f"bounds must lie within the hard limits {list(limits)} (a solver narrows them, "
                f"never widens them), got {list(bounds)}",
            )
        _check_widths(plugin, widths, problem.n_layers, problem.budget, problem.multiple)
        low, high = bounds or limits
        rule(
            plugin,
            any(not low <= w <= high for w in widths),
            f"every width must lie within [{low}, {high}] (the hard limits and the solver's "
            f"bounds), got {widths}",
        )
        rule(plugin, plugin.solve(problem) != widths, "the same problem must give the same widths")
        uniform = problem.budget // problem.n_layers
        if len(set(problem.work)) == 1 and uniform % problem.multiple == 0:
            rule(
                plugin,
                widths != [uniform] * problem.n_layers,
                f"equal work must give every layer the uniform width {uniform}, got {widths}",
            )


def _check_widths(plugin: Any, widths: Any, n_layers: int, budget: int, multiple: int) -> None:
    """What every width list keeps: one integer per layer, on budget exactly, in multiples."""
    rule(
        plugin,
        not isinstance(widths, list) or len(widths) != n_layers,
        f"widths must be a list of one width per layer ({n_layers}), got {widths!r}",
    )
    rule(
        plugin,
        not all(isinstance(w, int) and not isinstance(w, bool) for w in widths),
        f"every width must be an int, got {[type(w).__name__ for w in widths]}",
    )
    rule(
        plugin,
        sum(widths) != budget,
        f"widths must sum exactly to the budget {budget}, got {sum(widths)} ({widths})",
    )
    rule(
        plugin,
        any(w < multiple or w % multiple for w in widths),
        f"every width must be a positive multiple of {multiple}, got {widths}",
    )


def check_schedule(
    cls: type[Any],
    params: dict[str, Any] | None = None,
    dims: ModelDims = DIMS,
    profiles: Mapping[str, Sequence[float]] | None = None,
    arms: Mapping[str, Sequence[int]] | None = None,
) -> None:
    """Check a ``schedule`` plugin class against its contract (docs/plugins.md) for the model
    ``dims``: ``check(dims)`` finds no problem (else pass ``params`` or ``dims`` it accepts); the
    widths (from :meth:`~geospec.kinds.Schedule.widths_from`, or
    :meth:`~geospec.kinds.ScoreAllocation.widths_from_scores` for a score allocation, which must
    refuse ``widths`` with a one-line error) are one integer per layer, summing exactly to
    ``dims.budget``, positive multiples of ``dims.multiple_of``, none above ``dims.max_width``,
    all within the schedule's own bounds; the same inputs give the same widths (a schedule is
    deterministic: seeded where it is random) and stay unchanged. The profiles it requires and
    the arms it reads are made up (seeded, uneven) unless ``profiles``/``arms`` give them.
    Raises :class:`~geospec.testing.ContractError` naming the broken rule."""
    plugin = plugin_instance(cls, Schedule, params)
    problems = plugin.check(dims)
    rule(
        plugin,
        not isinstance(problems, list) or not all(isinstance(p, str) for p in problems),
        f"check(dims) must return a list of messages, got {problems!r}",
    )
    rule(
        plugin,
        bool(problems),
        f"check(dims) reports problems for the model checked ({'; '.join(problems)}); pass "
        "params or dims it accepts",
    )
    given_profiles = {
        name: list(profiles[name]) if profiles and name in profiles else _profile(dims.n_layers, i)
        for i, name in enumerate(plugin.required_profiles())
    }
    given_arms = {
        name: list(arms[name]) if arms and name in arms else _uneven_widths(dims)
        for name in plugin.required_arms()
    }
    copies = (
        {k: list(v) for k, v in given_profiles.items()},
        {k: list(v) for k, v in given_arms.items()},
    )
    if reads_scores(cls):
        width = dims.max_width or dims.ffn_width
        generator = random.Random(0)
        scores = [[generator.random() for _ in range(width)] for _ in range(dims.n_layers)]
        refused: BaseException | None = None
        try:
            plugin.widths(dims, given_profiles)
        except Exception as error:  # what it raises is the rule's business, below
            refused = error
        rule(
            plugin,
            not isinstance(refused, GeospecError),
            "a score allocation must refuse widths(dims, profiles) (a training arm has no neuron "
            "scores) with a one-line error such as UsageError (ScoreAllocation's own does), got "
            + ("no error" if refused is None else f"{type(refused).__name__}: {refused}"),
        )

        if isinstance(plugin, ScoreAllocation) and plugin.reads_cut_losses:
            searched = plugin

            def compute() -> list[int]:
                layers = [list(layer) for layer in scores]
                return searched.widths_from_losses(dims, layers, _made_up_losses(dims.n_layers))
        elif isinstance(plugin, ScoreAllocation) and plugin.reads_search:
            explorer = plugin

            def compute() -> list[int]:
                layers = [list(layer) for layer in scores]
                search = _made_up_search(dims.n_layers)
                return explorer.widths_from_search(dims, layers, given_arms, search)
        elif isinstance(plugin, ScoreAllocation) and plugin.reads_block_linears:
            blocks, allocation = _random_blocks(dims.n_layers), plugin

            def compute() -> list[int]:
                layers = [list(layer) for layer in scores]
                return allocation.widths_from_blocks(dims, layers, blocks)
        else:

            def compute() -> list[int]:
                return plugin.widths_from_scores(dims, [list(layer) for layer in scores])
    else:

        def compute() -> list[int]:
            return plugin.widths_from(dims, given_profiles, given_arms)

    widths = compute()
    rule(
        plugin,
        (given_profiles, given_arms) != copies,
        "the schedule must not change the profiles or arm widths it is given",
    )
    _check_widths(plugin, widths, dims.n_layers, dims.budget, dims.multiple_of)
    cap = dims.max_width or dims.budget
    rule(plugin, max(widths) > cap, f"no width may exceed {cap}, got {widths}")
    bounds = plugin.bounds_from(dims, {name: None for name in given_arms})
    if bounds is not None:
        rule(
            plugin,
            any(not bounds[0] <= w <= bounds[1] for w in widths),
            f"every width must lie within the schedule's bounds {list(bounds)}, got {widths}",
        )
    rule(plugin, compute() != widths, "the same inputs must give the same widths")


def _made_up_losses(n_layers: int) -> Any:
    """Calibration losses for a search allocation: sum over layers of c_l / w_l, c_l seeded
    and uneven (a narrower layer always costs more)."""
    weights = _profile(n_layers, seed=7)

    def losses(widths: Sequence[int], changes: Sequence[tuple[int, int]]) -> list[float]:
        base = [c / w for c, w in zip(weights, widths, strict=True)]
        total = sum(base)
        return [total - base[layer] + weights[layer] / width for layer, width in changes]

    return losses


def _made_up_search(n_layers: int) -> Any:
    """A search's fitness, sum over layers of c_l / w_l as in :func:`_made_up_losses` on any
    windows (64 of 128 tokens), with a state kept nowhere (every search starts afresh)."""
    from geospec.kinds import Search

    weights = _profile(n_layers, seed=7)

    class Fitness:
        windows, window_tokens = 64, 128

        def __call__(
            self,
            candidates: Sequence[Sequence[int]],
            windows: Sequence[int],
            base: Sequence[int] | None = None,
        ) -> list[float]:
            return [sum(c / w for c, w in zip(weights, ws, strict=True)) for ws in candidates]

    class State:
        def load(self) -> dict[str, Any] | None:
            return None

        def save(self, state: dict[str, Any]) -> None:
            pass

    return Search(lambda kind, top_k=None: Fitness(), State())


def _random_blocks(n_layers: int) -> list[Any]:
    """Seeded decoder layers of two linear maps each (heavy-tailed weights, uneven inputs by
    layer), for a score allocation that reads block linears: the only branch of these checks
    that imports torch."""
    import torch

    from geospec.kinds import BlockLinears, LinearInputs

    generator = torch.Generator().manual_seed(0)
    blocks = []
    for layer in range(n_layers):
        linears = []
        for name, shape in (("attn", (16, 8)), ("mlp", (8, 16))):
            weight = torch.randn(shape, generator=generator) ** 3
            rms = torch.rand(shape[1], generator=generator, dtype=torch.float64) * (1 + layer)
            linears.append(LinearInputs(name, weight, rms))
        blocks.append(BlockLinears(layer, tuple(linears)))
    return blocks


def _uneven_widths(dims: ModelDims) -> list[int]:
    """On-budget widths that differ by layer: one multiple moved from every odd layer to the
    even layer before it."""
    widths = [dims.ffn_width] * dims.n_layers
    if dims.ffn_width > dims.multiple_of:
        for layer in range(1, dims.n_layers, 2):
            widths[layer - 1] += dims.multiple_of
            widths[layer] -= dims.multiple_of
    return widths
