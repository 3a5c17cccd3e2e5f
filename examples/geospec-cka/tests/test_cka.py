"""The cka statistic keeps the statistic contract in every builtin geometry."""

from __future__ import annotations

from geospec_cka import CKA

from geospec.testing import check_statistic


def test_it_keeps_the_statistic_contract() -> None:
    check_statistic(CKA, geometries=("raw", "spherical", "hyperbolic"))
