"""Every arm's FFN widths for a spec, and the profiles they are computed from.

This is the "solve" stage as a library: :func:`compute_widths` turns a spec plus (optional)
measured profiles into integer widths per arm with their FFN parameter counts, listing the arms
whose profiles are not available yet as pending. :func:`read_profiles` reads the profiles file
``{"profiles": {"topology/hyperbolic": [L floats], ...}}`` that the measure stage writes, and
:func:`write_widths` writes ``widths.json`` into the run directory.

Torch-free: ``geospec widths`` and ``geospec validate`` import this module.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geospec.atomic import atomic_write_json
from geospec.errors import GeospecError, PluginError, UsageError
from geospec.model_size import total_ffn_params
from geospec.spec import ModelSpec, Spec, model_dims

WIDTHS_FILE = "widths.json"
PROFILES_KEY = "profiles"
MAX_PROFILES_BYTES = 100_000_000


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
    spec: Spec,
    profiles: Mapping[str, Sequence[float]] | None = None,
    *,
    profiles_source: str | None = None,
) -> WidthsResult:
    """Widths per arm for ``spec``; arms whose profiles are missing from ``profiles`` are pending.

    ``profiles_source`` (the profiles file, say) prefixes error messages so they name the input.

    When the reference model is the spec's own model (no ``reference.checkpoint``), every profile an
    arm reads must have exactly ``model.n_layers`` values; profiles of a pretrained reference may
    have any depth (schedules resample them). Every computed arm is checked to keep the uniform
    model's FFN parameter count exactly. Errors name the arm (and the profile).
    """
    from geospec.plugins import get_registries

    registries = get_registries()
    dims = model_dims(spec)
    m = spec.model
    available = dict(profiles or {})
    uniform_params = total_ffn_params(m.d_model, [m.ffn_width] * m.n_layers, m.activation, m.bias)
    widths: dict[str, list[int]] = {}
    params: dict[str, int] = {}
    pending: dict[str, list[str]] = {}
    for arm in spec.arms:
        schedule = registries.create("schedule", arm.schedule)
        needed = schedule.required_profiles()
        missing = [name for name in needed if name not in available]
        if missing:
            pending[arm.name] = missing
            continue
        try:
            if spec.reference.checkpoint is None:
                for name in needed:
                    check_profile(name, available[name], length=m.n_layers)
            arm_widths = [int(w) for w in schedule.widths(dims, available)]
        except GeospecError as error:
            where = f"{profiles_source}: " if profiles_source else ""
            raise UsageError(f"{where}arm {arm.name!r}: {error}") from error
        _check_schedule_output(arm.name, arm.schedule.kind, arm_widths, dims.budget, m)
        params[arm.name] = total_ffn_params(m.d_model, arm_widths, m.activation, m.bias)
        if params[arm.name] != uniform_params:  # equal width sums imply this; checked regardless
            raise PluginError(
                f"arm {arm.name!r}: {params[arm.name]} FFN parameters, uniform has {uniform_params}"
            )
        widths[arm.name] = arm_widths
    return WidthsResult(widths, params, pending)


def _check_schedule_output(
    arm: str, kind: str, widths: list[int], budget: int, m: ModelSpec
) -> None:
    """A schedule plugin (possibly third-party) must honour its contract; say which one did not."""
    problems = []
    if len(widths) != m.n_layers:
        problems.append(f"{len(widths)} widths for {m.n_layers} layers")
    if sum(widths) != budget:
        problems.append(f"widths sum to {sum(widths)}, not the budget {budget}")
    if any(w < 1 or w % m.multiple_of for w in widths):
        problems.append(f"widths must be positive multiples of {m.multiple_of}")
    if problems:
        raise PluginError(
            f"arm {arm!r}: schedule {kind!r} returned {widths}: " + "; ".join(problems)
        )


def write_widths(run_dir: str | Path, result: WidthsResult) -> Path:
    """Write ``widths.json`` (the shape of :meth:`WidthsResult.to_json`) atomically; return it."""
    path = Path(run_dir) / WIDTHS_FILE
    atomic_write_json(path, result.to_json())
    return path


def check_profile(
    name: str,
    values: Any,
    *,
    length: int | None = None,
    positive: bool = False,
    nonzero: bool = True,
) -> list[float]:
    """Validate one per-layer profile and return it as floats, or raise :class:`UsageError`.

    A profile is a non-empty list of finite, non-negative numbers, not all zero (``positive``:
    every value above zero, as intrinsic dimensions are; ``nonzero=False`` accepts all zeros);
    ``length``, when given, is the number of values it must have.
    """
    where = f"profile {name!r}"
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise UsageError(f"{where} must be a list of numbers, one per layer, not {_kind(values)}")
    if not values:
        raise UsageError(f"{where} is empty; it needs one value per layer")
    if length is not None and len(values) != length:
        raise UsageError(
            f"{where} has {len(values)} values but the reference model has {length} layers; "
            "give one value per layer of the reference model"
        )
    floats = []
    for layer, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise UsageError(f"{where}: layer {layer} is {value!r}, not a number")
        number = float(value)
        if not math.isfinite(number):
            raise UsageError(f"{where}: layer {layer} is {number} (not finite); re-measure it")
        if number < 0 or (positive and number == 0):
            sign = "positive" if positive else "non-negative"
            raise UsageError(f"{where}: layer {layer} is {number}; values must be {sign}")
        floats.append(number)
    if nonzero and not any(floats):
        raise UsageError(
            f"{where}: all {len(floats)} values are zero; there is no work to allocate by"
        )
    return floats


def resample_profile(values: Sequence[float], n_layers: int) -> list[float]:
    """Linear interpolation over normalised depth: layer i of L sits at i / (L - 1).

    The first and last layers of the reference map to the first and last layers of the target; a
    single target layer sits at depth 0.5 and a single reference value is constant over depth.
    """
    n_source = len(values)
    if n_source == n_layers:
        return [float(v) for v in values]
    if n_source == 1:
        return [float(values[0])] * n_layers
    out = []
    for i in range(n_layers):
        depth = i / (n_layers - 1) if n_layers > 1 else 0.5
        position = depth * (n_source - 1)
        left = min(math.floor(position), n_source - 2)
        fraction = position - left
        out.append(float(values[left]) * (1 - fraction) + float(values[left + 1]) * fraction)
    return out


def read_profiles(path: str | Path) -> dict[str, list[float]]:
    """Read a profiles file ``{"profiles": {"name": [floats], ...}}`` (other top-level keys are
    ignored), or raise :class:`UsageError` naming the file and the problem."""
    path = Path(path)
    source = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{source}: no such profiles file; check the path") from None
    except IsADirectoryError:
        raise UsageError(f"{source}: is a directory; give the profiles JSON file") from None
    except OSError as error:
        raise UsageError(f"{source}: cannot be read: {error.strerror}") from None
    if len(raw) > MAX_PROFILES_BYTES:
        raise UsageError(f"{source}: is {len(raw)} bytes; a profiles file is small JSON")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise UsageError(f"{source}: not UTF-8 text (byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise UsageError(
            f"{source}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get(PROFILES_KEY), dict):
        raise UsageError(
            f'{source}: expected {{"{PROFILES_KEY}": {{"statistic/geometry": [one number per '
            f"layer], ...}}}}, got {_describe_top(data)}"
        )
    profiles = {}
    for name, values in data[PROFILES_KEY].items():
        try:
            # An all-zero profile is stored faithfully; it is an error only for an arm that uses it.
            profiles[name] = check_profile(name, values, nonzero=False)
        except UsageError as error:
            raise UsageError(f"{source}: {error}") from None
    return profiles


def _describe_top(data: Any) -> str:
    if isinstance(data, dict):
        if PROFILES_KEY not in data:
            keys = ", ".join(repr(k) for k in list(data)[:5]) or "none"
            return f"an object without a {PROFILES_KEY!r} key (keys: {keys})"
        return f"{PROFILES_KEY!r} holding {_kind(data[PROFILES_KEY])}"
    return _kind(data)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}")
