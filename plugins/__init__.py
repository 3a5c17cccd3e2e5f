"""geospec's builtin plugins, registered through the same hooks as any third-party plugin.

This package is shipped inside the geospec wheel under the import name ``geospec_plugins``. Each
module below implements one or more ``geospec_register_*`` hooks; heavy libraries (torch, POT,
ripser, geoopt) are imported only inside the code that computes.
"""

BUILTIN_MODULES = [
    "geospec_plugins.geometries",
    "geospec_plugins.statistics",
    "geospec_plugins.smoothers",
    "geospec_plugins.solvers",
    "geospec_plugins.schedules",
    "geospec_plugins.launchers",
    "geospec_plugins.slurm",
    "geospec_plugins.trackers",
    "geospec_plugins.importances",
]
