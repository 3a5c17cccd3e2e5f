"""From work profiles to integer widths: schedule outputs checked against the budget
(``widths``, with the profile checks of :mod:`geospec.profiles` and the largest-remainder
rounding of :mod:`geospec.rounding`). Torch-free."""
