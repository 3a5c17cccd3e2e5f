"""A plugin that fails at import time, as a plugin with a missing dependency would."""

import geospec_missing_dependency  # noqa: F401  (does not exist: this is the point)
