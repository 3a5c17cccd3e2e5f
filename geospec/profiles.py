"""Work profiles as the solver takes them: checked (:func:`check_profile`), resampled to another
depth (:func:`resample_profile`) and read from a profiles file (:func:`read_profiles`).

Torch-free; schedules and solvers reach these helpers through :mod:`geospec.kinds`.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from geospec.errors import UsageError

PROFILES_KEY = "profiles"
MAX_PROFILES_BYTES = 100_000_000


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
