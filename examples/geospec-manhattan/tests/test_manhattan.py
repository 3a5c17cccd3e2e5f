"""The manhattan geometry keeps the geometry contract and measures the L1 distance."""

from __future__ import annotations

import torch
from geospec_manhattan import Manhattan

from geospec.testing import check_geometry, check_statistic, registered


def test_it_keeps_the_geometry_contract() -> None:
    check_geometry(Manhattan)


def test_the_shift_statistic_keeps_its_contract_in_it() -> None:
    import geospec_manhattan

    from geospec.registry.loading import get_registries

    # registered: the module's hooks (pip installs its entry point; a source checkout has none)
    with registered(geospec_manhattan, name="geospec-manhattan", builtins=True):
        check_statistic(get_registries()["statistic"].get("shift").cls, geometries=("manhattan",))


def test_the_distance_is_the_sum_of_absolute_differences() -> None:
    a = torch.tensor([[0.0, 0.0], [1.0, -2.0]], dtype=torch.float64)
    b = torch.tensor([[3.0, 4.0], [1.0, 2.0]], dtype=torch.float64)
    geometry = Manhattan()
    assert geometry.paired(a, b).tolist() == [7.0, 4.0]
    assert geometry.pairwise(a).tolist() == [[0.0, 3.0], [3.0, 0.0]]
