"""Deprecated since 0.2.0: the profile helpers moved to :mod:`geospec.profiles` (below the plugin
contracts in :mod:`geospec.kinds`, which re-export them)."""

from __future__ import annotations

from geospec.moved import moved_names

__getattr__ = moved_names(
    __name__,
    {
        name: "geospec.profiles"
        for name in (
            "PROFILES_KEY", "MAX_PROFILES_BYTES", "check_profile", "resample_profile",
            "read_profiles",
        )
    },
)  # fmt: skip
