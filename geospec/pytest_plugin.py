"""A small pytest plugin for geospec plugin authors (loaded through the ``pytest11`` entry point).

Fixtures:

- ``geospec_registries``: fresh registries holding only geospec's builtins (installed third-party
  plugins are not loaded), in effect for the test.
- ``register_plugin``: a context manager factory; ``with register_plugin(my_module): ...`` makes
  ``my_module``'s hook implementations visible to validation and the pipeline inside the block only.

The helpers behind them (:func:`geospec.testing.minimal_spec`, :func:`geospec.testing.registered`)
import without pytest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from geospec.registry.loading import Registries
from geospec.testing import registered


@pytest.fixture
def geospec_registries() -> Iterator[Registries]:
    """Fresh registries with geospec's builtins only, in effect for the test."""
    with registered() as registries:
        yield registries


@pytest.fixture
def register_plugin() -> Callable[..., contextlib.AbstractContextManager[Registries]]:
    """``with register_plugin(obj): ...`` registers ``obj``'s hooks inside the block only."""
    return registered
