"""Every arm's FFN widths: the solve stage as a library.

:func:`compute_widths` turns the model, the arms and (optional) profiles into integer widths per
arm with their FFN parameter counts, listing the arms whose profiles are not available yet as
pending; every schedule's output is checked against the budget (:func:`width_problems`). Arms
derived from other arms (``fitted``, ``sorted``) are computed after them (:func:`arm_order`).
:func:`write_widths` writes ``widths.json``.

Torch-free: ``geospec widths`` and ``geospec validate`` import this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geospec.errors import GeospecError, PluginError, UsageError
from geospec.profiles import check_profile, read_profiles
from geospec.shapes.model_size import total_ffn_params
from geospec.spec.checks import dependency_cycle
from geospec.spec.resolve import model_dims
from geospec.spec.sections import ArmSpec, ModelSpec
from geospec.storage.atomic import atomic_write_json


@dataclass(frozen=True)
class WidthsResult:
    """Widths of every arm that could be computed, in spec order, and the arms still pending.

    ``pending`` maps an arm to the profiles it needs that were not given (for an arm derived from
    a pending arm: the profiles that one needs). ``notes`` maps an arm to a remark for the user:
    an arm derived from other arms that has exactly its source's widths (a ``sorted`` arm whose
    source is already monotone), or an arm waiting for a profiles file that does not exist yet.
    Notes are not part of :meth:`to_json`. ``bounds`` maps a computed arm to the smallest and
    largest width its schedule allowed (:meth:`Schedule.bounds`), or None where none was set.
    """

    widths: dict[str, list[int]]
    ffn_params: dict[str, int]
    pending: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    bounds: dict[str, tuple[int, int] | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The stable shape printed by ``geospec widths --json`` and written to widths.json."""
        return {
            "arms": {
                arm: {
                    "widths": list(widths),
                    "ffn_params": self.ffn_params[arm],
                    "bounds": _pair(self.bounds.get(arm)),
                }
                for arm, widths in self.widths.items()
            },
            "pending": list(self.pending),
        }

    def at_bounds(self, arm: str) -> str | None:
        """Which of the arm's layers sit at a bound of its schedule, in words, or None."""
        return bounds_note(self.widths[arm], self.bounds.get(arm))


def _pair(bounds: tuple[int, int] | None) -> list[int] | None:
    return None if bounds is None else [bounds[0], bounds[1]]


def layers_at_bounds(
    widths: Sequence[int], bounds: Sequence[int] | None
) -> tuple[list[int], list[int]]:
    """The layers (counted from 0) whose width is the lower bound, and those at the upper one."""
    if bounds is None:
        return [], []
    lower, upper = bounds
    return (
        [layer for layer, w in enumerate(widths) if w == lower],
        [layer for layer, w in enumerate(widths) if w == upper],
    )


def bounds_note(widths: Sequence[int], bounds: Sequence[int] | None) -> str | None:
    """ "layers 0-2 at the upper bound 1024; layer 11 at the lower bound 128", or None when no
    layer sits at a bound (or the schedule set none). At a bound the bound, not the profile,
    may have set the width: the schedule could have wanted more (or less) there."""
    lower, upper = layers_at_bounds(widths, bounds)
    if bounds is None or (not lower and not upper):
        return None
    parts = [
        f"{_layer_list(layers)} at the {side} bound {value}"
        for layers, side, value in ((upper, "upper", bounds[1]), (lower, "lower", bounds[0]))
        if layers
    ]
    return "; ".join(parts)


def _layer_list(layers: Sequence[int]) -> str:
    """ "layer 3", "layers 0-2, 5": runs of consecutive layers as ranges."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"layer{'s' if len(layers) > 1 else ''} {text}"


def compute_widths(
    model: ModelSpec,
    arms: Sequence[ArmSpec],
    profiles: Mapping[str, Sequence[float]] | None = None,
    *,
    pretrained_reference: bool = False,
    profiles_source: str | None = None,
) -> WidthsResult:
    """Widths per arm of ``model``; arms whose profiles are missing from ``profiles`` are pending.

    ``profiles_source`` (the profiles file, say) prefixes error messages so they name the input.

    When the reference model is the spec's own model, every profile an arm reads must have exactly
    ``model.n_layers`` values; profiles of a pretrained reference may have any depth (schedules
    resample them), and so may those of a profiles file an arm names (``profiles_file()``: the
    arm is pending, with a note, while the file does not exist). Arms are computed in spec
    order, except that an arm derived from other arms comes after them; the result lists them
    in spec order. Every computed arm is checked to keep the uniform model's FFN parameter count
    exactly. Errors name the arm (and the profile).
    """
    from geospec.registry.loading import get_registries

    registries = get_registries()
    m = model
    dims = model_dims(m)
    available = dict(profiles or {})
    uniform_params = total_ffn_params(m.d_model, [m.ffn_width] * m.n_layers, m.activation, m.bias)
    schedules = {arm.name: registries.create("schedule", arm.schedule) for arm in arms}
    kinds = {arm.name: arm.schedule.kind for arm in arms}
    widths: dict[str, list[int]] = {}
    bounds: dict[str, tuple[int, int] | None] = {}
    params: dict[str, int] = {}
    pending: dict[str, list[str]] = {}
    notes: dict[str, str] = {}
    files: dict[str, dict[str, list[float]]] = {}  # profiles files arms read, each read once
    for name in arm_order({arm: s.required_arms() for arm, s in schedules.items()}):
        schedule = schedules[name]
        sources = schedule.required_arms()
        waiting = [source for source in sources if source in pending]
        if waiting:
            pending[name] = list(dict.fromkeys(p for source in waiting for p in pending[source]))
            continue
        needed = schedule.required_profiles()
        path = schedule.profiles_file()
        if path is not None and not Path(path).exists():
            pending[name] = needed
            notes[name] = (
                f"reads its profiles from {path}, which does not exist yet; run the spec that "
                "measures them first"
            )
            continue
        if path is not None and path not in files:
            files[path] = read_profiles(path)
        arm_profiles = available if path is None else files[path]
        missing = [profile for profile in needed if profile not in arm_profiles]
        if missing and path is not None:
            held = ", ".join(repr(p) for p in arm_profiles) or "none"
            raise UsageError(f"arm {name!r}: {path} has no profile {missing[0]!r} (it has {held})")
        if missing:
            pending[name] = missing
            continue
        try:
            if not pretrained_reference and path is None:  # a file may hold another depth
                for profile in needed:
                    check_profile(profile, arm_profiles[profile], length=m.n_layers)
            given = {source: list(widths[source]) for source in sources}
            arm_widths = [int(w) for w in schedule.widths_from(dims, arm_profiles, given)]
            arm_bounds = schedule.bounds_from(dims, {source: bounds[source] for source in sources})
        except GeospecError as error:
            where = f"{profiles_source}: " if profiles_source else ""
            raise UsageError(f"{where}arm {name!r}: {error}") from error
        problems = width_problems(arm_widths, m, multiples=True)
        if not problems:
            problems = bounds_problems(arm_widths, arm_bounds)
        if problems:  # a schedule plugin (possibly third-party) broke its contract: say which
            raise PluginError(
                f"arm {name!r}: schedule {kinds[name]!r} returned {arm_widths}: "
                + "; ".join(problems)
            )
        params[name] = total_ffn_params(m.d_model, arm_widths, m.activation, m.bias)
        if params[name] != uniform_params:  # equal width sums imply this; checked regardless
            raise PluginError(
                f"arm {name!r}: {params[name]} FFN parameters, uniform has {uniform_params}"
            )
        widths[name] = arm_widths
        bounds[name] = None if arm_bounds is None else (int(arm_bounds[0]), int(arm_bounds[1]))
        same = next((source for source in sources if widths[source] == arm_widths), None)
        if same is not None:
            notes[name] = f"has exactly the widths of its source arm {same!r}"
    spec_order = [arm.name for arm in arms]
    return WidthsResult(
        {name: widths[name] for name in spec_order if name in widths},
        {name: params[name] for name in spec_order if name in params},
        {name: pending[name] for name in spec_order if name in pending},
        {name: notes[name] for name in spec_order if name in notes},
        {name: bounds[name] for name in spec_order if name in bounds},
    )


def arm_order(sources: Mapping[str, Sequence[str]]) -> list[str]:
    """The arms (``sources`` maps each arm, in spec order, to the arms it reads) in the order they
    are computed: spec order, except that an arm waits until every arm it reads is placed.

    Raises :class:`UsageError` for an arm that reads an unknown arm or arms that read each other
    in a cycle (spec validation reports both with the key's dotted path first).
    """
    for name, reads in sources.items():
        unknown = [source for source in reads if source not in sources]
        if unknown:
            raise UsageError(f"arm {name!r} reads the widths of {unknown[0]!r}, which is no arm")
    loop = dependency_cycle(sources)
    if loop:
        raise UsageError("arms read each other's widths in a cycle: " + " -> ".join(loop))
    order: list[str] = []
    while len(order) < len(sources):
        ready = (n for n in sources if n not in order and all(s in order for s in sources[n]))
        order.append(next(ready))
    return order


def width_problems(widths: Sequence[int], model: ModelSpec, multiples: bool) -> list[str]:
    """What keeps ``widths`` from being a schedule of ``model`` with the uniform model's exact
    budget: one positive width per layer, summing to ``n_layers * ffn_width`` (and, with
    ``multiples``, each a multiple of ``multiple_of``). Empty when they are sound."""
    budget = model.n_layers * model.ffn_width
    problems = []
    if len(widths) != model.n_layers:
        problems.append(f"{len(widths)} widths for {model.n_layers} layers")
    if sum(widths) != budget:
        problems.append(f"widths sum to {sum(widths)}, not the budget {budget}")
    if multiples and any(w < 1 or w % model.multiple_of for w in widths):
        problems.append(f"widths must be positive multiples of {model.multiple_of}")
    elif any(w < 1 for w in widths):
        problems.append("widths must be positive")
    return problems


def bounds_problems(widths: Sequence[int], bounds: Sequence[int] | None) -> list[str]:
    """What keeps ``bounds`` from being the bounds of ``widths``: a pair of integers, lower <=
    upper, holding every width. Empty when they are sound (or None: no bounds)."""
    if bounds is None:
        return []
    if (
        len(bounds) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
        or bounds[0] > bounds[1]
    ):
        return [f"bounds {list(bounds)} are not [lower, upper] with lower <= upper"]
    outside = [f"layer {i}: {w}" for i, w in enumerate(widths) if not bounds[0] <= w <= bounds[1]]
    if outside:
        return [f"widths outside its own bounds {list(bounds)}: " + ", ".join(outside)]
    return []


def write_widths(path: Path, result: WidthsResult) -> Path:
    """Write the shape of :meth:`WidthsResult.to_json` to ``path`` atomically; return it."""
    atomic_write_json(path, result.to_json())
    return path
