"""The step schedule keeps the schedule contract and gives the widths its formula says."""

from __future__ import annotations

import pytest
from geospec_step import Step

from geospec.kinds import ModelDims
from geospec.testing import ContractError, check_schedule


@pytest.mark.parametrize("params", [{}, {"ratio": 3.0, "split": 0.25}, {"ratio": 0.5}])
def test_it_keeps_the_schedule_contract(params: dict[str, float]) -> None:
    check_schedule(Step, params)
    check_schedule(Step, params, dims=ModelDims(12, 64, 96, 16, max_width=160))


def test_the_first_layers_are_ratio_times_wider() -> None:
    # 4 layers of 96: w1 = 2 * w2 and 2 * w1 + 2 * w2 = 384, so w2 = 64 and w1 = 128
    dims = ModelDims(n_layers=4, d_model=64, ffn_width=96, multiple_of=16)
    assert Step().widths(dims, {}) == [128, 128, 64, 64]


def test_a_split_with_no_layer_on_one_side_is_refused_by_check() -> None:
    with pytest.raises(ContractError, match="leaves no layer on one side"):
        check_schedule(Step, {"split": 0.05})
