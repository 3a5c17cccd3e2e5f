"""The example third-party plugin (examples/geospec-cka) computes through geospec's API."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from geospec.measure.work import measure_work
from geospec.testing import registered

pytestmark = pytest.mark.torch

SOURCE = Path(__file__).parents[1] / "examples" / "geospec-cka" / "src" / "geospec_cka"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> object:
    """The example package's module, imported from its source tree (pip installs it in nox)."""
    spec = importlib.util.spec_from_file_location("geospec_cka", SOURCE / "__init__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "geospec_cka", module)  # pydantic resolves annotations here
    spec.loader.exec_module(module)
    return module


def test_cka_is_zero_for_rotations_and_positive_otherwise(example: object) -> None:
    torch.manual_seed(0)
    x = torch.randn(200, 16, dtype=torch.float64)
    rotation, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
    with registered(example, name="geospec-cka"):
        same = measure_work(x, 3.0 * x @ rotation, geometry="raw", statistic="cka")
        other = measure_work(x, torch.randn(200, 16, dtype=torch.float64), "raw", "cka")
    assert same == pytest.approx(0.0, abs=1e-12)
    assert 0.5 < other <= 1.0
