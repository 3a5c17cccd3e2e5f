"""geospec: geometry-guided layerwise FFN width allocation for transformers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from geospec.moved import install_old_homes
from geospec.registry.hookspecs import hookimpl
from geospec.version import __version__

if TYPE_CHECKING:
    from geospec.measure.work import measure_profiles, measure_work
    from geospec.prune.true_width import load_pruned

__all__ = ["__version__", "hookimpl", "load_pruned", "measure_profiles", "measure_work"]

# Public functions of engine modules, imported on first use so that `import geospec` (and
# `geospec validate`) stays free of torch.
_LAZY = {
    "measure_work": "geospec.measure.work",
    "measure_profiles": "geospec.measure.work",
    "load_pruned": "geospec.prune.true_width",
}


# 0.1.0's modules whose names moved (``geospec.specfile``, ...) import from geospec.moved's table
install_old_homes()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'geospec' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
