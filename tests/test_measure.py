"""The public measuring API: measure_work, measure_profiles, input checks, parallel runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Literal

import numpy as np
import pytest
import torch
from geospec_plugins.geometries import Hyperbolic, Raw
from geospec_plugins.statistics import GromovWasserstein, Topology

import geospec
from geospec import hookimpl
from geospec.errors import GeospecError, PluginError, UsageError
from geospec.kinds import Geometry, Statistic
from geospec.measure.work import CloudError, measure_profiles, measure_work
from geospec.plugin import PluginParams
from geospec.registry.loading import Registries
from geospec.spec.sections import MeasureSpec

pytestmark = pytest.mark.torch

Register = Callable[..., AbstractContextManager[Registries]]
ALL_PROFILES = [
    f"{s}/{g}" for s in ("shift", "gw", "topology") for g in ("raw", "spherical", "hyperbolic")
]


def layers(count: int = 3, n: int = 40, d: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    clouds = []
    for layer in range(count):
        x = torch.randn(n, d, generator=g) + 1.0
        y = x + (0.1 * (layer + 1)) * torch.tanh(x @ torch.randn(d, d, generator=g))
        clouds.append((x, y))
    return clouds


def test_measure_work_is_the_statistic_in_the_geometry() -> None:
    x, y = layers(1)[0]
    expected = np.linalg.norm(x.double().numpy() - y.double().numpy(), axis=1).mean()
    assert measure_work(x, y) == pytest.approx(expected, rel=1e-12)  # defaults: shift, raw
    geometry = Hyperbolic(Hyperbolic.Params(radius=0.5))
    statistic = Topology(Topology.Params(degree=0))
    expected = statistic(geometry, x, y)
    for geometry_table, statistic_table in [
        ({"kind": "hyperbolic", "radius": 0.5}, {"kind": "topology", "degree": 0}),
        (Hyperbolic.Params(radius=0.5), Topology.Params(degree=0)),
    ]:
        got = measure_work(x, y, geometry=geometry_table, statistic=statistic_table)
        assert got == expected
    assert measure_work(x, y, "spherical", "gw") == GromovWasserstein()(
        geospec.measure.work.plugin_instance("geometry", "spherical"), x, y
    )


def test_measure_work_accepts_numpy_and_half_precision() -> None:
    x, y = layers(1)[0]
    assert measure_work(x.numpy(), y.numpy()) == measure_work(x, y)
    assert measure_work(x.bfloat16(), y.bfloat16()) == pytest.approx(
        measure_work(x.bfloat16().float(), y.bfloat16().float())
    )


def test_profiles_equal_measure_work_layer_by_layer() -> None:
    clouds = layers()
    profiles = measure_profiles(clouds, workers=1, progress=False)
    assert list(profiles) == ALL_PROFILES
    for name, values in profiles.items():
        statistic, geometry = name.split("/")
        assert values == [measure_work(x, y, geometry, statistic) for x, y in clouds]


def test_profiles_from_measure_specs_keep_their_names_and_params() -> None:
    clouds = layers(2)
    pairs = [
        MeasureSpec.model_validate(
            {"geometry": {"kind": "hyperbolic", "radius": 0.5}, "statistic": "shift"}
        ),
        MeasureSpec.model_validate(
            {"geometry": "raw", "statistic": {"kind": "gw", "coupling": "identity"}, "name": "id"}
        ),
    ]
    profiles = measure_profiles(clouds, pairs, workers=1)
    assert list(profiles) == ["shift/hyperbolic", "id"]
    assert profiles["shift/hyperbolic"] == [
        measure_work(x, y, {"kind": "hyperbolic", "radius": 0.5}, "shift") for x, y in clouds
    ]
    assert profiles["id"] == [
        measure_work(x, y, "raw", {"kind": "gw", "coupling": "identity"}) for x, y in clouds
    ]


def test_worker_processes_give_the_same_profiles() -> None:
    clouds = layers(3, n=30)
    pairs = ["gw/spherical", "topology/hyperbolic", "shift/raw"]
    inline = measure_profiles(clouds, pairs, workers=1)
    parallel = measure_profiles(clouds, pairs, workers=2)
    assert list(parallel) == pairs
    for name in pairs:
        assert parallel[name] == pytest.approx(inline[name], rel=1e-9)


def test_progress_is_quiet_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    measure_profiles(layers(2), ["shift/raw"], workers=1, progress=True)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


# Input checks ----------------------------------------------------------------------------


def bad_layer(layer: int, x: torch.Tensor, y: torch.Tensor) -> list[tuple[Any, Any]]:
    clouds: list[tuple[Any, Any]] = list(layers(3))
    clouds[layer] = (x, y)
    return clouds


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (torch.ones(40, 8), torch.ones(39, 8), "layer 2: x has 40 tokens but y has 39"),
        (torch.ones(40, 8), torch.ones(40, 6), "layer 2: x has 8 features per token but y has 6"),
        (torch.ones(3, 8), torch.ones(3, 8), "layer 2: only 3 tokens; work needs at least 4"),
        (torch.ones(40), torch.ones(40), r"layer 2: x has shape \(40,\); a cloud is a 2-D"),
        (
            torch.ones(40, 8),
            torch.ones(40, 8).index_fill_(0, torch.tensor([7]), float("nan")),
            r"layer 2: y holds 8 NaN or infinite values \(first in token 7\)",
        ),
        (
            torch.ones(40, 8).index_fill_(0, torch.tensor([5]), float("inf")),
            torch.ones(40, 8),
            r"layer 2: x holds 8 NaN or infinite values \(first in token 5\)",
        ),
    ],
)
def test_bad_clouds_name_the_layer_and_the_problem(
    x: torch.Tensor, y: torch.Tensor, message: str
) -> None:
    with pytest.raises(CloudError, match=message) as caught:
        measure_profiles(bad_layer(2, x, y), ["shift/raw"], workers=1)
    assert isinstance(caught.value, GeospecError)


@pytest.mark.parametrize("geometry", ["spherical", "hyperbolic"])
def test_zero_vectors_are_rejected_by_normalising_geometries(geometry: str) -> None:
    x, y = layers(1)[0]
    y = y.clone()
    y[5] = 0.0
    clouds = bad_layer(1, x, y)
    with pytest.raises(CloudError, match=r"layer 1, y \(after the FFN\): 1 token\(s\) are zero"):
        measure_profiles(clouds, [f"gw/{geometry}"], workers=1)
    with pytest.raises(CloudError, match=r"^clouds, y \(after the FFN\): 1 token"):
        measure_work(x, y, geometry, "shift")
    with pytest.raises(CloudError, match=r"^layer 7, y"):
        measure_work(x, y, geometry, "shift", layer=7)
    assert measure_profiles(clouds, ["gw/raw"], workers=1)["gw/raw"][1] > 0


def test_bad_plugin_tables_are_usage_errors() -> None:
    x, y = layers(1)[0]
    with pytest.raises(PluginError, match=r"unknown geometry 'hyperbolik'.*did you mean"):
        measure_work(x, y, geometry="hyperbolik")
    with pytest.raises(UsageError, match=r"geometry 'hyperbolic': radius: .*greater than 0"):
        measure_work(x, y, geometry={"kind": "hyperbolic", "radius": -1})
    with pytest.raises(UsageError, match="statistic 'gw': coupling: Input should be"):
        measure_work(x, y, statistic={"kind": "gw", "coupling": "best"})
    with pytest.raises(UsageError, match="a statistic is named by its kind"):
        measure_work(x, y, statistic=3)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="name a profile as 'statistic/geometry'"):
        measure_profiles(layers(1), ["topology"])
    with pytest.raises(UsageError, match="listed twice"):
        measure_profiles(layers(1), ["gw/raw", "gw/raw"])
    with pytest.raises(UsageError, match="workers must be at least 1"):
        measure_profiles(layers(1), ["gw/raw"], workers=0)


# Plugins from elsewhere --------------------------------------------------------------------


class CountingRaw(Raw):
    """The raw geometry, counting its distance matrices (to see them shared)."""

    calls: ClassVar[list[int]] = []

    class Params(PluginParams):
        kind: Literal["counting"] = "counting"

    def pairwise(self, points: torch.Tensor) -> torch.Tensor:
        CountingRaw.calls.append(len(points))
        return super().pairwise(points)


class CountingPlugin:
    @hookimpl
    def geospec_register_geometries(self, register: Any) -> None:
        register(CountingRaw)


def test_statistics_of_one_layer_share_the_distance_matrices(register_plugin: Register) -> None:
    CountingRaw.calls.clear()
    with register_plugin(CountingPlugin()):
        profiles = measure_profiles(
            layers(2), ["gw/counting", "topology/counting"], workers=1, progress=False
        )
    assert len(CountingRaw.calls) == 2 * 2  # x and y of each layer, once for both statistics
    assert profiles["gw/counting"] == measure_profiles(layers(2), ["gw/raw"])["gw/raw"]


def test_plugins_that_cannot_reach_worker_processes_run_in_process(
    register_plugin: Register,
) -> None:
    class Tokens(Statistic):  # defined in a function: cannot be pickled to a worker
        class Params(PluginParams):
            kind: Literal["tokens"] = "tokens"

        def __call__(self, geometry: Geometry, x: torch.Tensor, y: torch.Tensor) -> float:
            return float(len(geometry.prepare(x)))

    class Plugin:
        @hookimpl
        def geospec_register_statistics(self, register: Any) -> None:
            register(Tokens)

    with register_plugin(Plugin()):
        profiles = measure_profiles(layers(2, n=300), ["tokens/raw"], workers=2)
    assert profiles == {"tokens/raw": [300.0, 300.0]}


def test_importing_geospec_does_not_import_torch() -> None:
    code = (
        "import sys, geospec; assert 'torch' not in sys.modules; "
        "f = geospec.measure_work; assert 'torch' in sys.modules; "
        "import geospec.measure.work as m; assert f is m.measure_work"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        geospec.nothing  # noqa: B018
