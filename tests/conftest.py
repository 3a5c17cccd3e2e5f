from __future__ import annotations

import os

# Nothing in the test suite may reach a model or dataset hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Tests see only the builtins unless a test registers plugins itself.
os.environ.setdefault("GEOSPEC_DISABLE_PLUGIN_AUTOLOAD", "1")
