"""Where documents come from: the bundled corpora, local files or a hub dataset.

- ``bundled:mix`` (the default): the bundled corpora below interleaved in equal shares
  (:mod:`~geospec.engine.mix`).
- ``bundled:austen`` / ``bundled:shakespeare`` / ``bundled:python-code`` /
  ``bundled:python-docs``: text shipped in the package (:mod:`geospec.data.bundled`, its licences
  in geospec/data/corpora.md), cut into documents at chapter (Austen), scene (Shakespeare),
  module (code) or page (docs) headings.
- ``files``: ``.txt`` (documents are blank-line separated blocks; or whole files, or the pieces
  between a separator: ``data.txt_documents``), ``.json``/``.jsonl`` and
  ``.parquet`` (one document per row, from ``data.text_field``); compressed files (gzip, bz2, xz,
  zstd) are read transparently.
- anything else in ``source`` is a Hugging Face hub dataset name (``hub_config``, ``hub_split``,
  ``hub_revision``, ``streaming``), read by :mod:`~geospec.engine.hub_dataset`: online through
  datasets, offline (``HF_HUB_OFFLINE=1``) from the Hugging Face cache.

Text (the bundled corpora and ``.txt``, plain or gzip/bz2/xz) is read here, exactly as datasets'
``text`` builder reads it (UTF-8, universal newlines; a whole file per document, or blocks split
at blank lines), so the core path needs no ``datasets``; rows (json, parquet), zstd and the hub go
through ``datasets``.

Empty documents are dropped; ``max_documents`` keeps the first N of the rest.
"""

from __future__ import annotations

import bz2
import contextlib
import functools
import gzip
import hashlib
import lzma
import re
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import IO, Any

import numpy as np

from geospec.data.bundled import BUNDLED, BUNDLED_PREFIX, MIX, MIX_CHARACTERS, bundled_names
from geospec.engine.mix import Piece, mix_pieces
from geospec.engine.split import split_fractions
from geospec.errors import UsageError
from geospec.spec.sections import DataSpec

BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".zstd")
#: compressed text read without datasets (zstd needs a package: datasets reads it)
OPENERS: dict[str, Any] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
BATCH = 1000
#: characters read at a time when splitting a text file into paragraphs (datasets' chunk size)
CHUNK = 10 << 20


def bundled_path(name: str) -> Path:
    """The file of a bundled corpus (the mix has none: it is made of the others)."""
    if name not in BUNDLED:
        known = ", ".join(bundled_names())
        raise UsageError(f"data.source: unknown bundled corpus {name!r}; available: {known}")
    return Path(str(resources.files("geospec") / "data" / BUNDLED[name].file))


def bundled_documents(name: str) -> list[str]:
    """A bundled corpus's non-empty documents, as ``bundled:NAME`` reads them."""
    with gzip.open(bundled_path(name), "rt", encoding="utf-8") as handle:
        return [d for d in re.split(BUNDLED[name].documents, handle.read()) if d.strip()]


def _builder(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSION:
        suffixes.pop()
    builder = BUILDERS.get(suffixes[-1]) if suffixes else None
    if builder is None:
        raise UsageError(
            f"data.files: {path} has an unsupported extension; use .txt, .json, .jsonl or "
            ".parquet (optionally compressed, e.g. .jsonl.gz)"
        )
    return builder


def _file_digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Corpus:
    """The documents a :class:`DataSpec` names, in a fixed order; iterable more than once."""

    def __init__(self, data: DataSpec, spec_dir: Path | None = None) -> None:
        self.data = data
        corpus = data.corpus or ""
        #: the bundled corpus's name, or None for local files and hub datasets
        self.bundled = (
            corpus.removeprefix(BUNDLED_PREFIX) if corpus.startswith(BUNDLED_PREFIX) else None
        )
        self.files: list[Path] = []
        if data.files is not None:
            base = spec_dir or Path.cwd()
            for i, name in enumerate(data.files):
                path = (base / name).resolve()
                if not path.is_file():
                    raise UsageError(
                        f"data.files[{i}]: {path} not found; paths are relative to the spec file"
                    )
                _builder(path)
                self.files.append(path)
        elif self.bundled == MIX:  # its files' digests key the tokens
            self.files.extend(bundled_path(name) for name in MIX_CHARACTERS)
        elif self.bundled is not None:
            self.files.append(bundled_path(self.bundled))
        self._hub_documents: int | None = None

    def documents_hint(self) -> int | None:
        """How many documents the corpus will give, where that is cheap to know (parquet files'
        row counts, a hub dataset's recorded size once it is loaded, ``max_documents``), for
        progress; None otherwise. Empty rows are counted, so it can exceed the true number."""
        known: int | None = self._hub_documents
        if self.files and all(_builder(path) == "parquet" for path in self.files):
            import pyarrow.parquet as pq

            known = sum(pq.ParquetFile(path).metadata.num_rows for path in self.files)
        limit = self.data.max_documents
        if limit is not None:
            return limit if known is None else min(known, limit)
        return known

    def digests(self) -> list[str]:
        """Content digests of the local (or bundled) files; empty for a hub dataset."""
        return [_file_digest(path) for path in self.files]

    def batches(self, size: int = BATCH) -> Iterator[list[str]]:
        """Lists of at most ``size`` non-empty documents, in corpus order."""
        limit = self.data.max_documents
        seen = 0
        pending: list[str] = []
        for text in self._texts():
            if not text.strip():
                continue
            pending.append(text)
            seen += 1
            if len(pending) == size:
                yield pending
                pending = []
            if limit is not None and seen >= limit:
                break
        if pending:
            yield pending

    @functools.cached_property
    def _mix(self) -> list[Piece]:
        documents = {name: bundled_documents(name) for name in MIX_CHARACTERS}
        return mix_pieces(documents, MIX_CHARACTERS, self.data.split_seed, self.data.val_fraction)

    def held_out(self, indices: np.ndarray) -> np.ndarray:
        """Which of the documents at ``indices`` (places among the non-empty documents, in
        corpus order) the validation split holds: those whose seeded hash falls below
        ``val_fraction`` (:func:`~geospec.engine.split.split_fractions`), or in the mix the
        pieces of the documents its parts hold out (:mod:`~geospec.engine.mix`)."""
        if self.bundled == MIX:
            return np.array([piece.held_out for piece in self._mix], dtype=bool)[indices]
        return split_fractions(indices, self.data.split_seed) < self.data.val_fraction

    def _texts(self) -> Iterator[str]:
        if self.bundled == MIX:
            yield from (piece.text for piece in self._mix)
            return
        if not self.files:
            yield from self._hub_texts()
            return
        for path in self.files:
            if _text_opener(path) is not None:
                yield from self._plain_texts(path)
            else:
                with (
                    tempfile.TemporaryDirectory(prefix="geospec-datasets-") as cache,
                    _quiet_datasets(),
                ):
                    yield from self._file_texts(path, cache)

    def _plain_texts(self, path: Path) -> Iterator[str]:
        """A text file's documents, as datasets' text builder would give them."""
        opener = _text_opener(path)
        assert opener is not None
        try:
            # text mode: universal newlines ("\r\n" and "\r" become "\n"), as in datasets
            with opener(path, "rt", encoding="utf-8") as handle:
                if self.bundled:
                    yield from re.split(BUNDLED[self.bundled].documents, handle.read())
                elif self.data.txt_documents == "file":
                    yield handle.read()
                elif self.data.txt_documents == "separator":
                    assert self.data.txt_separator  # the spec requires it
                    yield from handle.read().split(self.data.txt_separator)
                else:
                    yield from _paragraphs(handle)
        except UnicodeDecodeError as error:
            raise UsageError(f"data.files: {path} is not UTF-8 text ({error})") from None

    def _file_texts(self, path: Path, cache: str) -> Iterator[str]:
        import datasets

        builder = _builder(path)
        options: dict[str, Any] = {}
        by = self.data.txt_documents
        if builder == "text":  # zstd text: bundled corpora are gzip
            options["sample_by"] = "paragraph" if by == "paragraphs" else "document"
        dataset = datasets.load_dataset(
            builder, data_files=str(path), split="train", cache_dir=cache, **options
        )
        field = "text" if builder == "text" else self.data.text_field
        _check_field(dataset.column_names, field, str(path))
        for batch in dataset.iter(batch_size=BATCH):
            if builder == "text" and by == "separator":
                assert self.data.txt_separator  # the spec requires it
                for text in batch[field]:
                    yield from text.split(self.data.txt_separator)
            else:
                yield from batch[field]

    def _hub_texts(self) -> Iterator[str]:
        from geospec.engine.hub_dataset import documents_in, load_hub_dataset

        d = self.data
        dataset = load_hub_dataset(d)
        self._hub_documents = documents_in(dataset, d.hub_split)
        where = f"hub dataset {d.corpus!r}"
        _check_field(list(dataset.column_names or []), d.text_field, where)
        for batch in dataset.iter(batch_size=BATCH):
            if d.text_field not in batch:  # a streamed dataset may not know its columns up front
                _check_field(list(batch), d.text_field, where)
            yield from batch[d.text_field]


def _text_opener(path: Path) -> Any:
    """How to open ``path`` as text without datasets (``open`` or a decompressor), or None."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSION else None
    if not suffixes or BUILDERS.get(suffixes[-1]) != "text":
        return None
    return open if compression is None else OPENERS.get(compression)


def _paragraphs(handle: IO[str], chunk_size: int = CHUNK) -> Iterator[str]:
    """The non-empty blocks between ``"\n\n"``, read a chunk at a time (datasets' paragraph
    sampling: the same blocks as splitting the whole text)."""
    rest = ""
    while chunk := handle.read(chunk_size):
        blocks = (rest + chunk + handle.readline()).split("\n\n")
        yield from (block for block in blocks[:-1] if block)
        rest = blocks[-1]
    if rest:
        yield rest


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Hide datasets' per-file progress bars for the small local files (restored afterwards)."""
    from datasets.utils import logging as datasets_logging

    enabled = datasets_logging.is_progress_bar_enabled()
    datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            datasets_logging.enable_progress_bar()


def _check_field(columns: list[str], field: str, where: str) -> None:
    if columns and field not in columns:
        raise UsageError(
            f"data.text_field: {where} has no column {field!r}; its columns are "
            f"{', '.join(columns)}"
        )
