"""Which documents are held out: [data]'s split, a seeded hash of each document's index.

The token cache (:mod:`~geospec.engine.token_data`) puts document i into the validation split
when :func:`split_fractions` gives it a number below ``data.val_fraction``; the mix
(:mod:`~geospec.engine.mix`) holds out the pieces of the documents each of its parts holds out
so.
"""

from __future__ import annotations

import numpy as np


def split_fractions(indices: np.ndarray, seed: int) -> np.ndarray:
    """A uniform number in [0, 1) per document index: splitmix64 of the index keyed by the seed.

    Document i goes to validation when its number is below ``val_fraction``; the assignment depends
    only on (seed, i), so it is the same however the documents are batched or streamed.
    """
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([seed], dtype=np.uint64))[0]
        z = _splitmix64(indices.astype(np.uint64) ^ key)
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
