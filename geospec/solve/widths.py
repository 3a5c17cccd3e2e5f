"""Every arm's FFN widths: the solve stage as a library.

:func:`compute_widths` turns the model, the arms and (optional) profiles into integer widths per
arm with their FFN parameter counts, listing the arms whose profiles are not available yet as
pending; every schedule's output is checked against the budget (:func:`width_problems`).
:func:`write_widths` writes ``widths.json``.

Torch-free: ``geospec widths`` and ``geospec validate`` import this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geospec.atomic import atomic_write_json
from geospec.engine.model_size import total_ffn_params
from geospec.errors import GeospecError, PluginError, UsageError
from geospec.solve.profiles import check_profile
from geospec.spec.resolve import model_dims
from geospec.spec.sections import ArmSpec, ModelSpec


@dataclass(frozen=True)
class WidthsResult:
    """Widths of every arm that could be computed, in spec order, and the arms still pending.

    ``pending`` maps an arm to the profiles it needs that were not given.
    """

    widths: dict[str, list[int]]
    ffn_params: dict[str, int]
    pending: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The stable shape printed by ``geospec widths --json`` and written to widths.json."""
        return {
            "arms": {
                arm: {"widths": list(widths), "ffn_params": self.ffn_params[arm]}
                for arm, widths in self.widths.items()
            },
            "pending": list(self.pending),
        }


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
    resample them). Every computed arm is checked to keep the uniform model's FFN parameter count
    exactly. Errors name the arm (and the profile).
    """
    from geospec.registry.loading import get_registries

    registries = get_registries()
    m = model
    dims = model_dims(m)
    available = dict(profiles or {})
    uniform_params = total_ffn_params(m.d_model, [m.ffn_width] * m.n_layers, m.activation, m.bias)
    widths: dict[str, list[int]] = {}
    params: dict[str, int] = {}
    pending: dict[str, list[str]] = {}
    for arm in arms:
        schedule = registries.create("schedule", arm.schedule)
        needed = schedule.required_profiles()
        missing = [name for name in needed if name not in available]
        if missing:
            pending[arm.name] = missing
            continue
        try:
            if not pretrained_reference:
                for name in needed:
                    check_profile(name, available[name], length=m.n_layers)
            arm_widths = [int(w) for w in schedule.widths(dims, available)]
        except GeospecError as error:
            where = f"{profiles_source}: " if profiles_source else ""
            raise UsageError(f"{where}arm {arm.name!r}: {error}") from error
        problems = width_problems(arm_widths, m, multiples=True)
        if problems:  # a schedule plugin (possibly third-party) broke its contract: say which
            raise PluginError(
                f"arm {arm.name!r}: schedule {arm.schedule.kind!r} returned {arm_widths}: "
                + "; ".join(problems)
            )
        params[arm.name] = total_ffn_params(m.d_model, arm_widths, m.activation, m.bias)
        if params[arm.name] != uniform_params:  # equal width sums imply this; checked regardless
            raise PluginError(
                f"arm {arm.name!r}: {params[arm.name]} FFN parameters, uniform has {uniform_params}"
            )
        widths[arm.name] = arm_widths
    return WidthsResult(widths, params, pending)


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


def write_widths(path: Path, result: WidthsResult) -> Path:
    """Write ``widths.json`` (the shape of :meth:`WidthsResult.to_json`) atomically; return it."""
    atomic_write_json(path, result.to_json())
    return path
