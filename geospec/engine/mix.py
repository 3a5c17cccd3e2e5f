"""The default corpus, ``bundled:mix``: the bundled novels, drama, code and modern prose
(:data:`geospec.data.bundled.MIX_CHARACTERS`, a quarter each), interleaved so that every
stretch of it, and of its held-out part, holds each kind in about its share.

1. Pieces: each corpus's documents (chapters, scenes, modules, pages) are cut at blank lines, a
   piece ending at the first blank line at or past ``PIECE_CHARACTERS`` characters (a
   document's last piece may be shorter): every piece is its corpus's text, verbatim.
2. Shares: of a corpus's n pieces, m evenly spaced ones are taken (piece i where
   floor((i + 1) m / n) > floor(i m / n)), m = n x its characters in the mix / all of its
   characters, rounded: text from all through the corpus (every novel, play, package, page).
3. Held out: [data]'s split holds out position i of the mix where ``split_fractions(i,
   split_seed) < val_fraction`` (:mod:`~geospec.engine.split`, what the token cache applies).
   Those positions get as many pieces, each corpus its share of them (largest remainders),
   drawn with ``split_seed``; the other positions get the rest. So the validation split (the
   selection windows, the eval's) is the mix too, and holds no piece the training split holds.
4. Interleave: each part (held out, training) is laid out in order of its pieces' progress
   through their corpus's characters in that part (the characters up to a piece's middle over
   all of them), ties in the corpus order: in every prefix of a part, each corpus's characters
   are its share of the prefix's to within about two pieces.

The mix is a function of the bundled files and of [data]'s ``split_seed`` and ``val_fraction``:
the same in every process, another held-out sample for another seed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from geospec.data.bundled import PIECE_CHARACTERS
from geospec.engine.split import split_fractions

#: What separates two blocks (paragraphs, speeches, top-level statements) of a document.
BLANK_LINE = "\n\n"


@dataclass(frozen=True)
class Piece:
    """A stretch of one bundled corpus: its name, the piece's place among all of its pieces,
    and its text."""

    corpus: str
    index: int
    text: str


def cut(document: str, size: int = PIECE_CHARACTERS) -> list[str]:
    """``document`` cut at blank lines into pieces of at least ``size`` characters (the last
    one may be shorter): ``BLANK_LINE.join(cut(document)) == document``."""
    pieces: list[str] = []
    start = 0
    while (end := document.find(BLANK_LINE, start + size)) >= 0:
        pieces.append(document[start:end])
        start = end + len(BLANK_LINE)
    pieces.append(document[start:])
    return pieces


def evenly_spaced(n: int, m: int) -> list[int]:
    """``m`` of the indices ``0 .. n - 1``, spread evenly (all of them where ``m >= n``)."""
    return [i for i in range(n) if (i + 1) * m // n > i * m // n] if m < n else list(range(n))


def shares(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights``, in whole numbers that add up to it (the
    largest remainders round up; ties to the earlier weight)."""
    exact = [total * w / sum(weights) for w in weights]
    counts = [int(e) for e in exact]
    by_remainder = sorted(range(len(weights)), key=lambda k: (counts[k] - exact[k], k))
    for k in by_remainder[: total - sum(counts)]:
        counts[k] += 1
    return counts


def interleave(parts: Sequence[Sequence[Piece]]) -> list[Piece]:
    """The pieces of every corpus in order of their progress through that corpus's characters
    (each piece at its middle), ties in the order of ``parts``."""
    keyed: list[tuple[float, int, int]] = []
    for k, pieces in enumerate(parts):
        total = sum(len(p.text) for p in pieces)
        before = 0
        for j, piece in enumerate(pieces):
            keyed.append(((before + len(piece.text) / 2) / total, k, j))
            before += len(piece.text)
    return [parts[k][j] for _, k, j in sorted(keyed)]


def mix_pieces(
    documents: Mapping[str, Sequence[str]],
    characters: Mapping[str, int],
    split_seed: int,
    val_fraction: float,
    size: int = PIECE_CHARACTERS,
) -> list[Piece]:
    """The mix of ``documents`` (each corpus's, by name), about ``characters[name]`` of each,
    laid out for [data]'s split by ``split_seed`` and ``val_fraction`` (the module's steps)."""
    chosen: list[list[Piece]] = []
    for name, wanted in characters.items():
        texts = [p for document in documents[name] for p in cut(document, size) if p.strip()]
        available = sum(len(text) for text in texts)
        taken = evenly_spaced(len(texts), round(len(texts) * wanted / available))
        chosen.append([Piece(name, i, texts[i]) for i in taken])
    positions = sum(len(pieces) for pieces in chosen)
    held = split_fractions(np.arange(positions), split_seed) < val_fraction
    rng = np.random.default_rng(split_seed)
    held_out: list[list[Piece]] = []
    training: list[list[Piece]] = []
    counts = shares(int(held.sum()), [len(pieces) for pieces in chosen])
    for pieces, count in zip(chosen, counts, strict=True):
        drawn = set(rng.choice(len(pieces), size=count, replace=False).tolist())
        held_out.append([p for i, p in enumerate(pieces) if i in drawn])
        training.append([p for i, p in enumerate(pieces) if i not in drawn])
    held_order, training_order = iter(interleave(held_out)), iter(interleave(training))
    return [next(held_order) if h else next(training_order) for h in held]
