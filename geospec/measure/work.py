"""Measuring geometric work: one pair of clouds, or every layer x profile at once, in parallel.

``measure_work(x, y, geometry=..., statistic=...)`` measures how much one FFN sub-layer moved
the cloud ``x`` (token states before it, n x d) to ``y`` (after it, same tokens, same order).
``measure_profiles(clouds, pairs)`` measures a whole model: one list of per-layer values for
each geometry x statistic pair ("profile"), spread over worker processes.

Geometries and statistics are plugins, named by tables (``{"kind": "hyperbolic", "radius":
0.9}``), bare kind names, or validated ``Params``; they are resolved through the registries in
effect (:func:`geospec.registry.loading.get_registries`).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import torch
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from geospec.errors import GeospecError, UsageError
from geospec.kinds import Geometry, Statistic
from geospec.plugin_base import PluginParams, PluginTableError, as_table

#: Fewer tokens than this make every statistic degenerate (and topology meaningless).
MIN_TOKENS = 4
#: Below this many tokens a cloud is measured in milliseconds: worker processes cost more.
PARALLEL_MIN_TOKENS = 256
#: Default workers at most: each one imports torch (a few hundred MB) before it measures.
MAX_DEFAULT_WORKERS = 16

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from geospec.engine.distributed import DistContext

Cloud: TypeAlias = "torch.Tensor | ArrayLike"
"""n x d token states: a tensor, or anything torch.as_tensor takes (a numpy array)."""

PluginTable = str | Mapping[str, Any] | PluginParams
"""A plugin named by its kind ("raw"), a table ({"kind": "gw", "coupling": "identity"}) or
validated ``Params``."""


class CloudError(GeospecError):
    """A cloud that cannot be measured; the message names the layer and the problem."""


class MeasureLike(Protocol):
    """One profile to measure, as :class:`geospec.spec.sections.MeasureSpec` describes it."""

    @property
    def geometry(self) -> PluginParams: ...

    @property
    def statistic(self) -> PluginParams: ...

    @property
    def profile(self) -> str: ...


@dataclass(frozen=True)
class Measurement:
    """A resolved profile: its name and the plugin instances that measure it."""

    profile: str
    geometry: Geometry
    statistic: Statistic


def measure_work(
    x: Cloud,
    y: Cloud,
    geometry: PluginTable = "raw",
    statistic: PluginTable = "shift",
    *,
    layer: int | str | None = None,
) -> float:
    """The work the sub-layer did moving cloud ``x`` to cloud ``y``, in one geometry.

    ``x`` and ``y`` are n x d tensors (n >= 4) holding the same tokens in the same order.
    ``layer`` only names the clouds in error messages. Raises :class:`CloudError` for clouds
    that cannot be measured and :class:`UsageError` / ``PluginError`` for a bad geometry or
    statistic.
    """
    where = _where(layer)
    geometry_plugin = plugin_instance("geometry", geometry)
    statistic_plugin = plugin_instance("statistic", statistic)
    x_cloud, y_cloud = check_clouds(x, y, where)
    check_domain(geometry_plugin, x_cloud, y_cloud, where)
    return _measure(statistic_plugin, geometry_plugin, x_cloud, y_cloud, where)


def measure_profiles(
    clouds: Sequence[tuple[Cloud, Cloud]],
    pairs: Sequence[MeasureLike | str] | None = None,
    *,
    workers: int | None = None,
    progress: bool | None = None,
    dist: DistContext | None = None,
    device: str | torch.device | None = None,
) -> dict[str, list[float]]:
    """Measure every profile on every layer: ``{profile: [one float per layer]}``.

    ``clouds`` holds one ``(x, y)`` pair per layer. ``pairs`` lists the profiles: objects with
    ``geometry``, ``statistic`` and ``profile`` (a :class:`~geospec.spec.sections.MeasureSpec`) or
    names
    such as ``"topology/hyperbolic"`` (default parameters); ``None`` measures every registered
    statistic in every registered geometry.

    Layers x geometries run in parallel in ``workers`` processes (default: one per available
    CPU core, at most 16; 1 measures in this process). The statistics of one layer and
    geometry run in the same process and share its distance matrices. Worker processes start
    with ``spawn``: a script that calls this at import time must guard it with
    ``if __name__ == "__main__":``. ``progress`` shows a bar on a terminal (default: when
    stderr is one); it stays quiet otherwise.

    Every cloud is checked before anything is measured; the first problem raises a
    :class:`CloudError` naming its layer.

    ``dist`` (under torchrun, every rank calling this with the same clouds): each rank measures
    its share of the (layer, geometry) tasks, round robin, with its share of the CPU cores, and
    every rank returns all the values, gathered: the values of one process, since each task is
    measured alone. A :class:`GeospecError` on any rank is raised on every rank.

    ``device`` (a CUDA GPU: the run's): the distance matrices of the geometries that compute on
    any device (``pairwise_on_device``, the builtins) are computed there in float32
    (:func:`pairwise_distances`); None or any other device: in float64 on the CPU.
    """
    measurements = resolve_pairs(pairs)
    on = _distance_device(device)
    checked = [check_clouds(x, y, _where(layer)) for layer, (x, y) in enumerate(clouds)]
    groups = _group_by_geometry(measurements)
    for layer, (x, y) in enumerate(checked):
        for geometry, _ in groups:
            check_domain(geometry, x, y, _where(layer))
    tasks = [
        _Task(
            layer,
            x,
            y,
            geometry,
            tuple(m.statistic for m in group),
            tuple(m.profile for m in group),
            on,
        )
        for layer, (x, y) in enumerate(checked)
        for geometry, group in groups
    ]
    results: dict[str, list[float]] = {m.profile: [math.nan] * len(checked) for m in measurements}
    ranks = dist if dist is not None and dist.enabled else None
    mine = tasks if ranks is None else tasks[ranks.rank :: ranks.world_size]
    share = 1 if ranks is None else ranks.world_size
    measured: list[tuple[str, int, float]] = []
    failure: GeospecError | None = None
    with _progress_bar(progress, len(measurements) * len(checked)) as advance:
        try:
            for task, values in _run(mine, _worker_count(workers, mine, checked, share)):
                measured += [
                    (profile, task.layer, value)
                    for profile, value in zip(task.profiles, values, strict=True)
                ]
                advance(len(values) * share)
        except GeospecError as error:
            if ranks is None:
                raise
            failure = error  # said on every rank below, so none waits for this one
    if ranks is not None:
        from geospec.engine.distributed import gather_stage_objects

        gathered = gather_stage_objects((measured, failure), ranks)
        failures = [error for _, error in gathered if error is not None]
        if failures:
            raise failures[0]
        measured = [value for values, _ in gathered for value in values]
    for profile, layer, value in measured:
        results[profile][layer] = value
    return results


def measure_replicates(
    clouds: Sequence[tuple[torch.Tensor, torch.Tensor]],
    replicates: int,
    pairs: Sequence[MeasureLike | str] | None = None,
    *,
    workers: int | None = None,
    progress: bool | None = None,
    dist: DistContext | None = None,
    device: str | torch.device | None = None,
) -> dict[str, list[list[float]]]:
    """Every profile on each of ``replicates`` token samples: ``{profile: [[one float per layer]
    per replicate]}``.

    Each layer's clouds hold the replicates' tokens one after the other in equal parts (as the
    probe stage stores them with ``probe.replicates``). All layers x replicates are measured in
    one :func:`measure_profiles` call, so they share its workers.
    """
    rows = len(clouds[0][0]) if clouds else 0
    if replicates < 1 or rows % replicates:
        raise UsageError(f"{rows} tokens per cloud cannot be split into {replicates} replicates")
    part = rows // replicates
    split = [
        (x[r * part : (r + 1) * part], y[r * part : (r + 1) * part])
        for r in range(replicates)
        for x, y in clouds
    ]
    flat = measure_profiles(
        split, pairs, workers=workers, progress=progress, dist=dist, device=device
    )
    n = len(clouds)
    return {name: [v[r * n : (r + 1) * n] for r in range(replicates)] for name, v in flat.items()}


# Resolving plugins ------------------------------------------------------------------------


def plugin_instance(kind: str, value: PluginTable) -> Any:
    """Validate a plugin table through the registry in effect and instantiate the plugin."""
    from geospec.registry.loading import get_registries

    try:
        return get_registries().create(kind, value)  # an unknown kind lists the available ones
    except PluginTableError as error:
        raise UsageError(str(error)) from None
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'table'}: {e['msg']}"
            for e in error.errors()
        )
        raise UsageError(f"{kind} {as_table(kind, value)['kind']!r}: {problems}") from None


def resolve_pairs(pairs: Sequence[MeasureLike | str] | None) -> list[Measurement]:
    """Turn profile descriptions into plugin instances; profile names must be unique."""
    from geospec.registry.loading import get_registries

    if pairs is None:
        pairs = [
            f"{statistic}/{geometry}" for statistic, geometry in get_registries().all_measures()
        ]
    measurements: list[Measurement] = []
    for pair in pairs:
        if isinstance(pair, str):
            statistic, _, geometry = pair.partition("/")
            if not statistic or not geometry:
                raise UsageError(
                    f"profile {pair!r}: name a profile as 'statistic/geometry', for example "
                    "'topology/hyperbolic'"
                )
            measurement = Measurement(
                pair, plugin_instance("geometry", geometry), plugin_instance("statistic", statistic)
            )
        else:
            measurement = Measurement(
                pair.profile,
                plugin_instance("geometry", pair.geometry),
                plugin_instance("statistic", pair.statistic),
            )
        if any(m.profile == measurement.profile for m in measurements):
            raise UsageError(f"profile {measurement.profile!r} is listed twice; give one a name")
        measurements.append(measurement)
    return measurements


def _group_by_geometry(
    measurements: list[Measurement],
) -> list[tuple[Geometry, list[Measurement]]]:
    """Measurements sharing a geometry (same class, same params), in first-seen order."""
    groups: dict[tuple[type, PluginParams], tuple[Geometry, list[Measurement]]] = {}
    for m in measurements:
        key = (type(m.geometry), m.geometry.params)
        groups.setdefault(key, (m.geometry, []))[1].append(m)
    return list(groups.values())


# Checking clouds --------------------------------------------------------------------------


def _where(layer: int | str | None) -> str:
    if layer is None:
        return "clouds"
    return f"layer {layer}" if isinstance(layer, int) else str(layer)


def check_clouds(x: Cloud, y: Cloud, where: str = "clouds") -> tuple[torch.Tensor, torch.Tensor]:
    """Check a pair of clouds and return them as CPU tensors; raise :class:`CloudError`."""
    x, y = _as_cloud(x, "x", where), _as_cloud(y, "y", where)
    if x.shape[0] != y.shape[0]:
        raise CloudError(
            f"{where}: x has {x.shape[0]} tokens but y has {y.shape[0]}; the clouds before and "
            "after the FFN must hold the same tokens in the same order"
        )
    if x.shape[1] != y.shape[1]:
        raise CloudError(
            f"{where}: x has {x.shape[1]} features per token but y has {y.shape[1]}; corresponding "
            "states must live in the same space"
        )
    if x.shape[0] < MIN_TOKENS:
        raise CloudError(
            f"{where}: only {x.shape[0]} tokens; work needs at least {MIN_TOKENS} (probe more "
            "tokens)"
        )
    return x, y


def _as_cloud(cloud: Any, name: str, where: str) -> torch.Tensor:
    try:
        tensor = torch.as_tensor(cloud).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as error:
        raise CloudError(f"{where}: {name} is not a tensor of numbers ({error})") from None
    if tensor.ndim != 2:
        raise CloudError(
            f"{where}: {name} has shape {tuple(tensor.shape)}; a cloud is a 2-D tensor "
            "(tokens x features)"
        )
    if not (tensor.is_floating_point() or tensor.dtype in (torch.int32, torch.int64)):
        raise CloudError(f"{where}: {name} has dtype {tensor.dtype}; give real numbers")
    if not tensor.is_floating_point():
        tensor = tensor.double()
    if tensor.dtype in (torch.float16, torch.bfloat16):
        tensor = tensor.float()  # half-precision arithmetic is slow and coarse on CPU
    finite = torch.isfinite(tensor)
    if not bool(finite.all()):
        bad = (~finite).nonzero()
        first = int(bad[0, 0])
        raise CloudError(
            f"{where}: {name} holds {len(bad)} NaN or infinite values (first in token {first}); "
            "the probed model diverged or the clouds file is corrupt"
        )
    return tensor.contiguous()


def check_domain(geometry: Geometry, x: torch.Tensor, y: torch.Tensor, where: str) -> None:
    """Check that the geometry can place both clouds (for example no zero vectors)."""
    for name, cloud in (("x (before the FFN)", x), ("y (after the FFN)", y)):
        try:
            geometry.prepare(cloud)
        except GeospecError as error:
            raise CloudError(f"{where}, {name}: {error}") from None


def _measure(
    statistic: Statistic, geometry: Geometry, x: torch.Tensor, y: torch.Tensor, where: str
) -> float:
    try:
        return float(statistic(geometry, x, y))
    except CloudError:
        raise
    except GeospecError as error:
        raise CloudError(f"{where}: {error}") from None


# Running in parallel ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Task:
    """All statistics of one layer in one geometry: they run in the same process."""

    layer: int
    x: torch.Tensor
    y: torch.Tensor
    geometry: Geometry
    statistics: tuple[Statistic, ...]
    profiles: tuple[str, ...]
    device: torch.device | None = None
    """Where the distance matrices are computed in float32 (None: float64 on the CPU)."""


def _run_task(task: _Task) -> list[float]:
    where = _where(task.layer)
    geometry = _remembering(task.geometry, task.device)
    return [_measure(s, geometry, task.x, task.y, where) for s in task.statistics]


class _Remembering(Geometry):
    """Mixed into a geometry's class: remembers prepared clouds and distance matrices.

    The statistics of one layer in one geometry receive the same x and y, and gw and topology
    both need both distance matrices: they are computed once. Results are looked up by the
    identity of the input tensor (kept alive with the result, so its id is not reused) and must
    be treated as read-only, which every statistic should do anyway.
    """

    _memo: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]
    _device: torch.device | None

    def prepare(self, cloud: torch.Tensor) -> torch.Tensor:
        return self._remember("prepare", cloud, super().prepare)

    def pairwise(self, points: torch.Tensor) -> torch.Tensor:
        return self._remember("pairwise", points, self._distances)

    def _distances(self, points: torch.Tensor) -> torch.Tensor:
        if self._device is None or not self.pairwise_on_device:
            return super().pairwise(points)
        # float32 on the device; the statistics get float64 on the CPU, as from the CPU path
        on_device = points.to(device=self._device, dtype=torch.float32)
        return super().pairwise(on_device).to(device="cpu", dtype=torch.float64)

    def _remember(
        self, what: str, tensor: torch.Tensor, compute: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        key = (what, id(tensor))
        if key not in self._memo:
            self._memo[key] = (tensor, compute(tensor))
        return self._memo[key][1]


def _remembering(geometry: Geometry, device: torch.device | None = None) -> Geometry:
    """The same geometry (same class as far as isinstance can tell, same params), remembering,
    its distance matrices computed on ``device`` (:func:`pairwise_distances`)."""
    cls = type(geometry)
    remembering = type(cls.__name__, (_Remembering, cls), {"__module__": cls.__module__})
    instance: _Remembering = remembering(geometry.params)
    instance._memo = {}
    instance._device = device
    return instance


def pairwise_distances(
    geometry: Geometry, points: torch.Tensor, device: torch.device | None
) -> torch.Tensor:
    """The distance matrix of prepared ``points`` as the measurement computes it: on ``device``
    in float32 when it is given and the geometry computes on any device
    (``pairwise_on_device``), returned in float64 on the CPU as the statistics expect; else
    ``geometry.pairwise(points)`` itself. (The measurement gives only a GPU as ``device``; the
    tests give the CPU, to check the float32 path against the float64 one.)"""
    return _remembering(geometry, device).pairwise(points)


def _distance_device(device: str | torch.device | None) -> torch.device | None:
    """Where distance matrices go: a CUDA GPU, or None (float64 on the CPU, also for 'cpu' and
    the devices no test has seen them computed on, such as 'mps')."""
    if device is None:
        return None
    resolved = torch.device(device)
    return resolved if resolved.type == "cuda" else None


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _worker_count(
    workers: int | None,
    tasks: list[_Task],
    clouds: list[tuple[torch.Tensor, torch.Tensor]],
    share: int = 1,
) -> int:
    """Worker processes for ``tasks``: ``workers``, else one per core (``share`` processes
    dividing the cores, as torchrun's ranks on one node do)."""
    if workers is not None:
        if workers < 1:
            raise UsageError(f"workers must be at least 1, not {workers}")
        return min(workers, max(1, len(tasks)))
    if not clouds or max(len(x) for x, _ in clouds) < PARALLEL_MIN_TOKENS:
        return 1
    return max(1, min(_available_cpus() // share, len(tasks), MAX_DEFAULT_WORKERS))


def _picklable(tasks: list[_Task]) -> bool:
    """Plugins defined in ``__main__`` or inside functions cannot travel to worker processes."""
    try:
        for task in tasks:
            pickle.dumps((task.geometry, task.statistics))
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def _run(tasks: list[_Task], workers: int) -> Iterator[tuple[_Task, list[float]]]:
    """Yield each task with its values as they finish."""
    if workers == 1 or not _picklable(tasks):
        for task in tasks:
            yield task, _run_task(task)
        return
    threads = max(1, _available_cpus() // workers)
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        workers, mp_context=context, initializer=_init_worker, initargs=(threads, os.getpid())
    )
    pending: dict[Future[list[float]], _Task] = {}
    try:
        pending = {pool.submit(_run_task, task): task for task in tasks}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                task = pending.pop(future)
                yield task, future.result()
    except BaseException:
        # interrupted (Ctrl-C, an error, the caller stopped): stop the workers now rather than
        # wait for their tasks, which nobody will read
        for process in list(getattr(pool, "_processes", {}).values()):
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _init_worker(threads: int, parent: int) -> None:
    """Give each worker its share of the cores (torch and the BLAS numpy and POT use), and end
    it with its parent: a parent killed (SIGTERM, SIGKILL) runs no clean-up, and a worker left
    behind would measure on for nobody."""
    _end_with_parent(parent)
    torch.set_num_threads(threads)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(threads)


def _end_with_parent(parent: int) -> None:
    import signal
    import threading
    import time

    try:  # Linux: the kernel signals this process when its parent dies
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)

    def watch() -> None:  # elsewhere (and as a second guard): notice the parent is gone
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="geospec-parent-watch", daemon=True).start()


@contextmanager
def _progress_bar(enabled: bool | None, total: int) -> Iterator[Callable[[int], None]]:
    """A bar on stderr when it is a terminal (and ``enabled`` is not False); silent otherwise."""
    console = Console(stderr=True)
    show = console.is_terminal and enabled is not False
    columns = (
        TextColumn("measuring"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True, disable=not show) as progress:
        task = progress.add_task("measure", total=total)
        yield lambda k: progress.advance(task, k)
