"""Names that moved: the old import path keeps working, with a warning naming the new one.

A module that used to hold public names (shown to users in an earlier README or docs page) becomes a
shim whose module-level ``__getattr__`` is built here, so that ``from geospec.train import
train_model`` still works after the engine moved to ``geospec.engine.train``: the name is imported
from its new home on first use (keeping torch out of ``import geospec.<old>``) and the warning says
where to import it from. Shims stay for at least one minor version (CHANGELOG.md lists them).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

#: The release in which the shims were added, and the earliest one that may remove them.
DEPRECATED_IN = "0.2.0"
REMOVED_IN = "0.3.0"


def moved_names(old_module: str, new_homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``old_module`` whose names now live in ``new_homes[name]``."""

    def __getattr__(name: str) -> Any:
        new_module = new_homes.get(name)
        if new_module is None:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warnings.warn(
            f"{old_module}.{name} moved to {new_module}.{name} in geospec {DEPRECATED_IN}; "
            f"import it from there (the old path goes in {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_module), name)

    return __getattr__
