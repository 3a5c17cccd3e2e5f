"""The geometry and statistic contract checks (docs/plugins.md)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from geospec.testing.contract import plugin_instance, rule

if TYPE_CHECKING:
    import torch

#: Tokens and features of the clouds the checks measure: small enough to be quick, enough
#: tokens for every builtin statistic (at least 4).
TOKENS, FEATURES = 40, 6


def check_geometry(cls: type[Any], params: dict[str, Any] | None = None) -> None:
    """Check a ``geometry`` plugin class against its contract (docs/plugins.md), on random
    float64 clouds of 40 tokens: ``prepare`` gives one float64 CPU row per token and leaves
    its cloud alone; ``pairwise`` an n x n float64 matrix, finite, non-negative, symmetric,
    with a zero diagonal; ``paired`` n such distances, equal to the matching entries of
    ``pairwise`` over both clouds, zero between a cloud and itself; ``scale_sensitive``
    says truly whether rescaling both clouds changes the distances; and with
    ``pairwise_on_device`` ``pairwise`` of float32 points gives finite distances on their device
    close to the float64 ones. Raises
    :class:`~geospec.testing.ContractError` naming the broken rule. Imports torch."""
    import torch

    from geospec.kinds import Geometry

    plugin = plugin_instance(cls, Geometry, params)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, FEATURES, dtype=torch.float64, generator=generator) + 0.5
    y = x + 0.3 * torch.randn(TOKENS, FEATURES, dtype=torch.float64, generator=generator)
    original = x.clone()
    px, py = _prepared(plugin, x), _prepared(plugin, y)
    rule(plugin, not torch.equal(x, original), "prepare must not change the cloud it is given")
    distances = plugin.pairwise(px)
    _check_distances(plugin, "pairwise", distances, (TOKENS, TOKENS))
    rule(
        plugin,
        not torch.allclose(distances, distances.T, rtol=1e-10, atol=1e-12),
        "pairwise distances must be symmetric (d(i, j) = d(j, i))",
    )
    largest = float(distances.abs().max())
    rule(
        plugin,
        float(distances.diagonal().abs().max()) > 1e-9 * max(1.0, largest),
        "pairwise distances must have a zero diagonal (d(i, i) = 0)",
    )
    paired = plugin.paired(px, py)
    _check_distances(plugin, "paired", paired, (TOKENS,))
    both = plugin.pairwise(torch.cat([px, py]))
    across = both[torch.arange(TOKENS), torch.arange(TOKENS) + TOKENS]
    rule(
        plugin,
        not torch.allclose(paired, across, rtol=1e-6, atol=1e-9),
        "paired(a, b)[i] must equal pairwise of both clouds at (a_i, b_i): the same distance",
    )
    itself = plugin.paired(px, px.clone())
    rule(
        plugin,
        float(itself.abs().max()) > 1e-9 * max(1.0, largest),
        "paired distances between a cloud and itself must be zero",
    )
    if cls.pairwise_on_device:
        _check_float32(plugin, px, distances)
    scaled = plugin.pairwise(_prepared(plugin, 3.0 * x))
    changed = not torch.allclose(scaled, distances, rtol=1e-6, atol=1e-9)
    says = "True" if cls.scale_sensitive else "False"
    rule(
        plugin,
        changed != cls.scale_sensitive,
        f"scale_sensitive must say whether rescaling both clouds changes the distances: it is "
        f"{says}, but scaling the cloud by 3 {'changed' if changed else 'did not change'} them",
    )


def _check_float32(plugin: Any, points: torch.Tensor, distances: torch.Tensor) -> None:
    """``pairwise_on_device``: the float32 points a GPU run hands ``pairwise`` (here on the
    CPU) give finite distances close to the float64 ones."""
    import torch

    single = points.float()
    try:
        on32 = plugin.pairwise(single)
    except Exception as error:  # numpy, or float64 assumed: the GPU path would fail the same way
        rule(
            plugin,
            True,
            f"pairwise_on_device is True, but pairwise fails on float32 points "
            f"({type(error).__name__}: {error}); set it False or compute with torch alone",
        )
    rule(
        plugin,
        not isinstance(on32, torch.Tensor)
        or on32.device != single.device
        or not bool(torch.isfinite(on32).all())
        or not torch.allclose(on32.double(), distances, rtol=1e-3, atol=1e-5),
        "pairwise_on_device is True, but pairwise of float32 points does not give finite "
        "distances on their device within 1e-3 of the float64 ones",
    )


def _prepared(plugin: Any, cloud: torch.Tensor) -> torch.Tensor:
    import torch

    points = plugin.prepare(cloud)
    rule(
        plugin,
        not isinstance(points, torch.Tensor) or points.ndim != 2 or len(points) != len(cloud),
        f"prepare must give one row per token ({len(cloud)} x k), got {_shape(points)}",
    )
    rule(
        plugin,
        points.dtype != torch.float64 or points.device.type != "cpu",
        f"prepare must give float64 on the CPU (distances are computed in float64), got "
        f"{points.dtype} on {points.device}",
    )
    return points


def _check_distances(plugin: Any, method: str, value: Any, shape: tuple[int, ...]) -> None:
    import torch

    rule(
        plugin,
        not isinstance(value, torch.Tensor) or tuple(value.shape) != shape,
        f"{method} must give a tensor of shape {shape}, got {_shape(value)}",
    )
    rule(
        plugin,
        value.dtype != torch.float64,
        f"{method} distances must be float64, got {value.dtype}",
    )
    rule(plugin, not bool(torch.isfinite(value).all()), f"{method} distances must be finite")
    rule(plugin, bool((value < 0).any()), f"{method} distances must be non-negative")


def _shape(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return str(tuple(shape)) if shape is not None else type(value).__name__


def check_statistic(
    cls: type[Any],
    params: dict[str, Any] | None = None,
    geometries: tuple[Any, ...] = ("raw",),
) -> None:
    """Check a ``statistic`` plugin class against its contract (docs/plugins.md), in each of
    ``geometries`` (kinds or tables, from the registries in effect), on random float64 clouds
    of 40 tokens: a finite, non-negative Python number; the same value twice; no change to the
    clouds; zero work between identical clouds; and the same work when the tokens of both
    clouds are permuted together (tokens are a set of pairs, not a sequence). Raises
    :class:`~geospec.testing.ContractError` naming the broken rule. Imports torch."""
    import torch

    from geospec.kinds import Statistic
    from geospec.plugin import create_plugin

    plugin = plugin_instance(cls, Statistic, params)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(TOKENS, FEATURES, dtype=torch.float64, generator=generator) + 0.5
    mixing = torch.randn(FEATURES, FEATURES, dtype=torch.float64, generator=generator)
    y = x + torch.tanh(x @ mixing)
    before = (x.clone(), y.clone())
    permutation = torch.randperm(TOKENS, generator=generator)
    for table in geometries:
        geometry = create_plugin("geometry", table)
        value = plugin(geometry, x, y)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        rule(plugin, not number, f"the work must be a Python float, got {type(value).__name__}")
        where = f" (geometry {geometry!r})"
        rule(plugin, not math.isfinite(value), f"the work must be finite{where}")
        rule(plugin, value < 0, f"the work must be non-negative, got {value}{where}")
        rule(
            plugin,
            not (torch.equal(x, before[0]) and torch.equal(y, before[1])),
            "the statistic must not change the clouds it is given",
        )
        rule(
            plugin,
            plugin(geometry, x, y) != value,
            f"the same clouds must give the same work{where}",
        )
        same = plugin(geometry, x, x.clone())
        rule(
            plugin,
            abs(same) > 1e-8 * max(1.0, abs(value)),
            f"the work between identical clouds must be 0, got {same}{where}",
        )
        moved = plugin(geometry, x[permutation], y[permutation])
        rule(
            plugin,
            abs(moved - value) > 1e-6 * abs(value) + 1e-9,
            f"permuting the tokens of both clouds together must not change the work: {value} "
            f"became {moved}{where}",
        )
