"""Helpers for testing geospec plugins, importable without pytest (and without torch).

:func:`minimal_spec` builds a valid spec dictionary to modify; :func:`registered` makes a plugin
object's hook implementations visible to validation and the pipeline inside a ``with`` block.
One contract check per kind (``check_geometry``, ``check_statistic``, ``check_smoother``,
``check_solver``, ``check_schedule``, ``check_launcher``, ``check_tracker``,
``check_importance``) runs a plugin class through the rules of its kind (docs/plugins.md) and
raises :class:`ContractError` naming the first rule it breaks; the checks of the kinds that
compute on tensors import torch when called.
The pytest fixtures built on them (``register_plugin``, ``geospec_registries``) live in
:mod:`geospec.pytest_plugin`, which pytest loads through the ``pytest11`` entry point.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from geospec.registry.entries import Provider
from geospec.registry.loading import Registries, build_registries, use_registries
from geospec.testing.contract import ContractError
from geospec.testing.importance import check_importance
from geospec.testing.launching import check_launcher, check_tracker
from geospec.testing.measures import check_geometry, check_statistic
from geospec.testing.widths import check_schedule, check_smoother, check_solver

__all__ = [
    "ContractError",
    "check_geometry",
    "check_importance",
    "check_launcher",
    "check_schedule",
    "check_smoother",
    "check_solver",
    "check_statistic",
    "check_tracker",
    "minimal_spec",
    "registered",
]

_MINIMAL_SPEC: dict[str, Any] = {
    "name": "test",
    "model": {
        "n_layers": 4,
        "d_model": 32,
        "n_heads": 2,
        "ffn_width": 64,
        "seq_len": 32,
        "multiple_of": 8,
    },
    "data": {"tokenizer": {"kind": "bpe", "vocab_size": 512}},
    "measure": [],
    "arms": [{"name": "uniform", "schedule": {"kind": "uniform"}}],
    "train": {"steps": 10, "batch_size": 4},
}


def minimal_spec(**sections: Any) -> dict[str, Any]:
    """A valid spec dictionary; keyword arguments replace (or, for dicts, update) top-level keys."""
    spec = copy.deepcopy(_MINIMAL_SPEC)
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key].update(value)
        else:
            spec[key] = value
    return spec


@contextlib.contextmanager
def registered(
    *plugins: Any, name: str = "test-plugin", builtins: bool = True
) -> Iterator[Registries]:
    """Registries holding the builtins plus ``plugins`` (objects with hook implementations),
    provided by ``name`` 0.0.0 from source (their provenance holds their module's hash)."""
    extra = [(plugin, Provider(name, "0.0.0", from_source=True)) for plugin in plugins]
    with use_registries(build_registries(builtins=builtins, entry_points=False, extra=extra)) as r:
        yield r
