from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile

# Nothing in the test suite may reach a model or dataset hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Tests see only the builtins unless a test registers plugins itself.
os.environ.setdefault("GEOSPEC_DISABLE_PLUGIN_AUTOLOAD", "1")
# The shared token cache (geospec.engine.token_data.shared_cache_dir) is the session's own, never
# the user's ~/.cache/geospec (subprocesses inherit it).
os.environ["GEOSPEC_CACHE"] = tempfile.mkdtemp(prefix="geospec-test-cache-")
atexit.register(shutil.rmtree, os.environ["GEOSPEC_CACHE"], True)

# In CI (CI set, as CI services do): Hypothesis draws the same examples on every run, so a failure
# reproduces from the log alone, keeps no example database, and puts what it still caches in the
# system's temporary directory instead of .hypothesis/ in the work tree (elsewhere:
# `pytest --hypothesis-profile ci`). The core session runs without Hypothesis installed.
HYPOTHESIS = importlib.util.find_spec("hypothesis") is not None
if HYPOTHESIS:
    from hypothesis import settings

    settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
    os.environ.setdefault(
        "HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "geospec-hypothesis")
    )
    if HYPOTHESIS:
        settings.load_profile("ci")
