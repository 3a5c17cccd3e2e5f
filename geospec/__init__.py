"""geospec: geometry-guided layerwise FFN width allocation for transformers."""

from __future__ import annotations

__version__ = "0.1.0"

from geospec.hookspecs import hookimpl

__all__ = ["__version__", "hookimpl"]
