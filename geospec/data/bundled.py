"""The corpora shipped in the package, and the default corpus: the mix of them.

Names only, no reading (that is :mod:`geospec.engine.corpus` and :mod:`geospec.engine.mix`), so
that the spec's messages and ``geospec validate`` can say what a ``bundled:`` name is without
numpy. Where each corpus comes from and its licence: corpora.md beside this file.
"""

from __future__ import annotations

from typing import NamedTuple

BUNDLED_PREFIX = "bundled:"


class BundledCorpus(NamedTuple):
    """One corpus in geospec/data: its file, the regex whose matches start a new document, and
    what kind of text it is."""

    file: str
    documents: str
    kind: str
    about: str


BUNDLED: dict[str, BundledCorpus] = {
    "austen": BundledCorpus(
        "austen.txt.gz", r"(?m)^(?=(?:CHAPTER|Chapter) [0-9IVXLC]+\.?[ \t]*$)", "novels",
        "Jane Austen's six novels, by chapter (public domain)",
    ),
    "shakespeare": BundledCorpus(
        "shakespeare.txt.gz", r"(?m)^(?=### )", "drama",
        "Shakespeare's plays, by scene (public domain)",
    ),
    "python-code": BundledCorpus(
        "python-code.txt.gz", r"(?m)^(?=# Lib/)", "code",
        "modules of 19 packages of CPython's standard library (PSF-2.0)",
    ),
    "python-docs": BundledCorpus(
        "python-docs.txt.gz", r"(?m)^(?=# )", "modern prose",
        "Python's tutorial, HOWTOs, FAQs and What's New, code examples left out (PSF-2.0)",
    ),
}  # fmt: skip

#: The default corpus of [data] (and so of a prune's calibration and selection) and of
#: ``prune.eval.corpora``: every kind of bundled text, each in its share.
MIX = "mix"
DEFAULT_CORPUS = f"{BUNDLED_PREFIX}{MIX}"
#: The mix's characters from each bundled corpus: a quarter each of novels, drama, code and
#: modern prose (every corpus holds more than this: bundled-corpora.json and the files).
MIX_CHARACTERS: dict[str, int] = dict.fromkeys(BUNDLED, 2_000_000)
#: The mix cuts every document into pieces: a piece ends at the first blank line at or past
#: this many characters (a document's last piece may be shorter), so that a few windows of any
#: stretch of the mix hold every kind.
PIECE_CHARACTERS = 2_000
#: The version of how geospec.engine.mix lays the pieces out: raised with any change to it.
MIX_LAYOUT = 1


def mix_recipe() -> dict[str, object]:
    """What makes the mix's text besides the files: run keys hold it, so a mix made otherwise
    (other shares, other pieces, another layout: :data:`MIX_LAYOUT` counts them) is never taken
    for this one."""
    return {"characters": MIX_CHARACTERS, "piece": PIECE_CHARACTERS, "layout": MIX_LAYOUT}


def bundled_names() -> list[str]:
    """Every ``bundled:`` name a spec may give, the mix last."""
    return [f"{BUNDLED_PREFIX}{name}" for name in (*BUNDLED, MIX)]


def mix_description() -> str:
    """What the mix is, in one line (validate, the docs)."""
    total = sum(MIX_CHARACTERS.values())
    parts = ", ".join(
        f"{name} ({BUNDLED[name].kind}) {chars / total:.0%}"
        for name, chars in MIX_CHARACTERS.items()
    )
    return (
        f"{parts} of {total / 1e6:g}M characters, interleaved in pieces of about "
        f"{PIECE_CHARACTERS:,}; its validation split is the same mix"
    )
