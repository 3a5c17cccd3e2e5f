from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import pkgutil
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Nothing in the test suite may reach a model or dataset hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Tests see only the builtins unless a test registers plugins itself.
os.environ.setdefault("GEOSPEC_DISABLE_PLUGIN_AUTOLOAD", "1")
# The shared token cache (geospec.engine.token_data.shared_cache_dir) is the session's own, never
# the user's ~/.cache/geospec (subprocesses inherit it).
os.environ["GEOSPEC_CACHE"] = tempfile.mkdtemp(prefix="geospec-test-cache-")
atexit.register(shutil.rmtree, os.environ["GEOSPEC_CACHE"], True)

# Under mutmut (nox -s mutation) the tests run in mutants/, a mutated copy of the tree.
UNDER_MUTMUT = (
    "MUTANT_UNDER_TEST" in os.environ and Path(__file__).resolve().parents[1].name == "mutants"
)


def _mutated_builtins_as_geospec_plugins() -> None:
    """In mutants/ the builtins are the package ``plugins`` (mutmut names a module after its
    path). The name the code imports, ``geospec_plugins``, is pointed at it; the editable install
    would map it to the unmutated plugins/ of the work tree."""
    package = importlib.import_module("plugins")
    sys.modules["geospec_plugins"] = package
    for module in pkgutil.iter_modules(package.__path__):
        sys.modules[f"geospec_plugins.{module.name}"] = importlib.import_module(
            f"plugins.{module.name}"
        )


if UNDER_MUTMUT:
    _mutated_builtins_as_geospec_plugins()

# In CI (CI set, as CI services do) and under mutmut: Hypothesis draws the same examples on every
# run, so a failure reproduces from the log alone (and every mutant meets the same examples),
# keeps no example database, and puts what it still caches in the system's temporary directory
# instead of .hypothesis/ in the work tree (elsewhere: `pytest --hypothesis-profile ci`). The
# core session runs without Hypothesis installed.
HYPOTHESIS = importlib.util.find_spec("hypothesis") is not None
if HYPOTHESIS:
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None)
if UNDER_MUTMUT or os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
    os.environ.setdefault(
        "HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "geospec-hypothesis")
    )
    if HYPOTHESIS:
        settings.load_profile("ci")


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for a module: tiny tensors, whose thread hand-offs would cost far more
    than the arithmetic on 2 busy cores (``pytest.mark.usefixtures("one_torch_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
