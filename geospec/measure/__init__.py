"""Measuring the reference model: geometric work (``work``), probing hooks (``probe``), layer
sensitivity (``sensitivity``) and intrinsic dimension (``intrinsic_dimension``).

``measure_work`` and ``measure_profiles`` are the public entry points (also importable from
``geospec`` itself).
"""

from geospec.measure.work import measure_profiles, measure_work

__all__ = ["measure_profiles", "measure_work"]
