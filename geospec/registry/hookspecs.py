"""The hooks a geospec plugin implements (``geospec.hookimpl`` marks an implementation).

A plugin is any object (usually a module) with functions decorated by ``geospec.hookimpl`` and
named like the specs below. Each hook is called once per plugin when the registries are built, with
a ``register`` callback; call it with each plugin class you provide. Builtins use the very same
hooks (see ``geospec_plugins``). Third-party packages expose their plugin object through the
entry-point group ``geospec``::

    [project.entry-points.geospec]
    my_plugin = "my_package.plugin"

A misspelled hook name (``geospec_register_geometry``) is an error, not a silent no-op.
"""

from __future__ import annotations

import pluggy

from geospec.kinds import KINDS
from geospec.plugin_base import Register

hookspec = pluggy.HookspecMarker("geospec")
hookimpl = pluggy.HookimplMarker("geospec")


@hookspec
def geospec_register_geometries(register: Register) -> None:
    """Register geometry classes (subclasses of :class:`geospec.kinds.Geometry`).

    Called once when the plugin registries are built. Call ``register(cls)`` for each class; its
    name is the literal default of ``cls.Params.kind``. A geometry maps an n x d cloud to the
    representation its distances need and gives pairwise (n x n) and paired (n) distances.
    """


@hookspec
def geospec_register_statistics(register: Register) -> None:
    """Register work statistics (subclasses of :class:`geospec.kinds.Statistic`).

    Called once when the plugin registries are built. A statistic is called as
    ``statistic(geometry, x, y) -> float`` on the clouds before and after one FFN sub-layer.
    """


@hookspec
def geospec_register_smoothers(register: Register) -> None:
    """Register profile smoothers (subclasses of :class:`geospec.kinds.Smoother`).

    Called once when the plugin registries are built. A smoother maps L floats to L floats.
    """


@hookspec
def geospec_register_solvers(register: Register) -> None:
    """Register width solvers (subclasses of :class:`geospec.kinds.Solver`).

    Called once when the plugin registries are built. ``solver.solve(problem)`` returns L integers,
    multiples of ``problem.multiple`` within the bounds, whose sum is exactly ``problem.budget``.
    """


@hookspec
def geospec_register_schedules(register: Register) -> None:
    """Register width schedules (subclasses of :class:`geospec.kinds.Schedule`).

    Called once when the plugin registries are built. ``schedule.widths(dims, profiles)`` returns
    L integers summing exactly to ``dims.n_layers * dims.ffn_width``.
    """


@hookspec
def geospec_register_launchers(register: Register) -> None:
    """Register launchers (subclasses of :class:`geospec.kinds.Launcher`).

    Called once when the plugin registries are built. A spec's ``[launch]`` section names one
    (``{ kind = "local" }`` when absent). ``launcher.launch(launch)`` has every arm-seed run of
    ``launch.runs`` trained by calling ``launch.trainer(run)`` somewhere (this process, worker
    processes, scheduler jobs) and returns one :class:`geospec.kinds.RunOutcome` per run.
    """


@hookspec
def geospec_register_trackers(register: Register) -> None:
    """Register experiment trackers (subclasses of :class:`geospec.kinds.Tracker`).

    Called once when the plugin registries are built. A spec lists trackers in ``[train]
    trackers``; every training run gets a fresh instance on rank 0: ``start(TrackedRun)``,
    ``log(step, metrics)`` for each ``metrics.jsonl`` row, ``end(result or None)``. A tracker that
    raises is turned off for that run with one warning; training goes on.
    """


@hookspec
def geospec_register_importances(register: Register) -> None:
    """Register neuron importance scores (subclasses of :class:`geospec.kinds.Importance`).

    Called once when the plugin registries are built. ``importance.scores(NeuronWeights)``
    returns one finite score per hidden neuron of one FFN; the demand stage and pruning keep the
    best-scored neurons (builtins ``magnitude``, ``activation``, ``random``).
    """


#: Hook name -> plugin kind it registers (from the kinds table).
REGISTER_HOOKS: dict[str, str] = {base.register_hook: kind for kind, base in KINDS.items()}
