"""From work profiles to integer widths: schedule outputs checked against the budget
(``widths``), profile checks and resampling (``profiles``), largest-remainder rounding
(``rounding``). Torch-free."""
