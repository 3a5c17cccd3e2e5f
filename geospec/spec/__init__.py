"""The spec: its sections (``sections``), reading and validating a file (``loading``), checks
that span sections (``checks``), values derived from it (``resolve``) and the summary ``geospec
validate`` prints (``summary``). Torch-free.

``Spec``, ``load_spec`` and ``validate_spec`` are importable from here; they load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from geospec.spec.loading import load_spec, validate_spec
    from geospec.spec.sections import Spec

__all__ = ["Spec", "load_spec", "validate_spec"]

_WHERE = {"Spec": "sections", "load_spec": "loading", "validate_spec": "loading"}


def __getattr__(name: str) -> Any:
    # Lazy, so that a submodule (geospec.spec.sections) can be imported without the others.
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'geospec.spec' has no attribute {name!r}")
    return getattr(importlib.import_module(f"geospec.spec.{module}"), name)
