"""The default corpus, ``bundled:mix``: the bundled novels, drama, code and modern prose
(:data:`geospec.data.bundled.MIX_CHARACTERS`, a quarter each), interleaved so that every
stretch of it, and of its held-out part, holds each kind in about its share.

1. Pieces: each corpus's documents (chapters, scenes, modules, pages) are cut at blank lines, a
   piece ending at the first blank line at or past ``PIECE_CHARACTERS`` characters (a
   document's last piece may be shorter): every piece is its corpus's text, verbatim.
2. Held out: a piece is held out when its document is one that corpus's own split holds out
   under [data]'s ``split_seed`` and ``val_fraction`` (``split_fractions`` of the document's
   index, :mod:`~geospec.engine.split`: what ``bundled:austen`` and the others hold out read
   alone). So the mix's training split holds no text of any part's validation split: calibrating
   on the mix and scoring ``bundled:shakespeare`` (or the mix) never shares text, and another
   seed holds out other documents.
3. Shares: of a corpus's training pieces, evenly spaced ones are taken (m of n: piece i where
   floor((i + 1) m / n) > floor(i m / n)) to make ``1 - val_fraction`` of its characters in the
   mix, and of its held-out pieces ``val_fraction`` of them (all of them where its held-out
   documents hold fewer): text from all through the corpus (every novel, play, package, page).
4. Interleave: each split's pieces are laid out in order of their progress through their
   corpus's characters in that split (the characters up to a piece's middle over all of them),
   ties in the corpus order, and the two splits are merged alike: in every prefix of a split,
   each corpus's characters are its share of the prefix's to within about two pieces.

The token cache asks the corpus which documents are held out (:meth:`Corpus.held_out
<geospec.engine.corpus.Corpus.held_out>`): for the mix, these pieces. The mix is a function of
the bundled files and of [data]'s ``split_seed`` and ``val_fraction``, the same in every process.
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
    """A stretch of one bundled corpus: its name, the piece's place among all of that corpus's
    pieces, its text, and whether its document is held out."""

    corpus: str
    index: int
    text: str
    held_out: bool


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
    """The mix of ``documents`` (each corpus's non-empty documents, by name), about
    ``characters[name]`` of each, its held-out pieces those of the documents [data]'s split
    holds out of that corpus (the module's steps)."""
    splits: dict[bool, list[list[Piece]]] = {False: [], True: []}
    for name, wanted in characters.items():
        held = split_fractions(np.arange(len(documents[name])), split_seed) < val_fraction
        pieces = [
            (bool(held[i]), text)
            for i, document in enumerate(documents[name])
            for text in cut(document, size)
            if text.strip()
        ]
        for part, share in ((False, 1 - val_fraction), (True, val_fraction)):
            indices = [j for j, (h, _) in enumerate(pieces) if h == part]
            available = sum(len(pieces[j][1]) for j in indices)
            count = round(len(indices) * wanted * share / available) if available else 0
            taken = [indices[t] for t in evenly_spaced(len(indices), count)]
            splits[part].append([Piece(name, j, pieces[j][1], part) for j in taken])
    return interleave([interleave(splits[False]), interleave(splits[True])])
