"""Tokens for training and validation, packed once into memory-mapped files.

:func:`prepare_data` reads the corpus (:mod:`~geospec.engine.corpus`), assigns every document to
the train or validation split by a seeded hash of its index (deterministic, independent of batching
and of streaming; the mix's pieces by the documents they come from: ``Corpus.held_out``), builds
the tokenizer (:mod:`~geospec.engine.tokenizer`; a BPE is trained on the training split only),
and writes each split as one flat array of token ids with an end-of-text token after every
document: ``train.bin`` / ``val.bin`` (uint16 when the vocabulary fits, else uint32), with
``tokenizer.json`` and ``meta.json`` beside them.

The result lives in ``cache_dir/<key>/`` where the key hashes the data section and the content of
local files, so every arm and seed of a run reads byte-identical validation tokens, and a changed
data section never reuses stale tokens. The directory is built as ``cache_dir/.<key>.partial/``
and renamed into place when complete (atomic); a lock file keeps concurrent processes from
preparing it twice. The build is resumable: every :data:`CHECKPOINT_BATCHES` batches of documents
it flushes the token files and records how far it got (``progress.json``), so a killed build
(``geospec prepare`` on a login node, a job at its time limit) continues from there, to the same
bytes as an uninterrupted one."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from tokenizers import Tokenizer

from geospec.engine.corpus import Corpus
from geospec.engine.progress import DataProgress
from geospec.engine.split import split_fractions  # noqa: F401 (its home before 0.2.0)
from geospec.engine.tokenizer import build_tokenizer, vocab_size
from geospec.errors import GeospecError, UsageError
from geospec.spec.sections import BPETokenizer, DataSpec
from geospec.storage.atomic import atomic_write_json
from geospec.storage.digests import file_digest
from geospec.storage.disk import writing
from geospec.storage.locks import file_lock

FORMAT_VERSION = 1
SPLITS = ("train", "val")
META_FILE = "meta.json"
#: where an unfinished build keeps its state (inside ``.<key>.partial/``)
STATE_FILE = "progress.json"
#: batches of documents (of :data:`geospec.engine.corpus.BATCH`) between two resumable points
CHECKPOINT_BATCHES = 10


class DamagedCache(GeospecError):
    """A token cache whose files do not match its meta.json (rebuilt when found)."""


@dataclass(frozen=True)
class TokenData:
    """A prepared dataset: packed token ids per split and the tokenizer that made them."""

    directory: Path
    train: np.ndarray
    """Memory-mapped (an empty split, where nothing is trained, is an empty array)."""
    val: np.ndarray
    vocab_size: int
    eot_id: int
    meta: dict[str, Any]

    @property
    def key(self) -> str:
        """Identifies the exact tokens (a hash of the data section and the source files)."""
        return self.directory.name

    @property
    def digests(self) -> dict[str, str]:
        """The content hash of each split (what the training fingerprint records)."""
        return dict(self.meta["digests"])

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.directory / "tokenizer.json"))

    @functools.cached_property
    def bos_id(self) -> int | None:
        """The token this tokenizer starts every text with (Gemma's ``<bos>``, Llama 3's
        ``<|begin_of_text|>``: its post-processor adds it), or None (GPT-2's, SmolLM2's add
        none). The packed splits hold none, so every window a model reads starts with it
        (:func:`geospec.engine.batches.window_tensors`): such a model scores text without its
        BOS as if it were garbled (Gemma-3-270M: 6.3 nats a token on Austen against 3.8)."""
        tokenizer = self.tokenizer()
        with_special = tokenizer.encode("a", add_special_tokens=True).ids
        plain = tokenizer.encode("a", add_special_tokens=False).ids
        if len(with_special) > len(plain) and with_special[1:] == plain[: len(with_special) - 1]:
            return int(with_special[0])
        return None

    @classmethod
    def open(cls, directory: Path, verify: bool = False) -> TokenData:
        """Open a prepared cache; the length of each split is checked against meta.json, and
        with ``verify`` its content hash too. Raises :class:`DamagedCache` saying what is wrong."""
        meta = _read_meta(directory)
        dtype = np.dtype(meta["dtype"])
        for name in SPLITS:
            path = directory / f"{name}.bin"
            expected = int(meta["tokens"][name]) * dtype.itemsize
            size = path.stat().st_size if path.is_file() else None
            if size != expected:
                found = "missing" if size is None else f"{size} bytes"
                raise DamagedCache(f"{path}: {found}, but {META_FILE} says {expected} bytes")
        if "digests" not in meta:  # a cache made before digests were recorded: record them now
            meta["digests"] = {name: file_digest(directory / f"{name}.bin") for name in SPLITS}
            atomic_write_json(directory / META_FILE, meta)
        elif verify:
            for name in SPLITS:
                if file_digest(directory / f"{name}.bin") != meta["digests"][name]:
                    raise DamagedCache(
                        f"{directory / f'{name}.bin'}: its content changed since it was prepared"
                    )
        splits = {  # an empty split (nothing trained) cannot be memory-mapped
            name: np.memmap(directory / f"{name}.bin", dtype=dtype, mode="r")
            if meta["tokens"][name]
            else np.zeros(0, dtype=dtype)
            for name in SPLITS
        }
        return cls(
            directory=directory,
            train=splits["train"],
            val=splits["val"],
            vocab_size=int(meta["vocab_size"]),
            eot_id=int(meta["eot_id"]),
            meta=meta,
        )


def _read_meta(directory: Path) -> dict[str, Any]:
    path = directory / META_FILE
    try:
        meta = json.loads(path.read_text())
        if not isinstance(meta, dict):
            raise TypeError("not a JSON object")
        np.dtype(meta["dtype"])
        if not all(isinstance(meta["tokens"][name], int) for name in SPLITS):
            raise TypeError("token counts are not integers")
        int(meta["vocab_size"]), int(meta["eot_id"])
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise DamagedCache(f"{path}: unreadable ({type(error).__name__})") from None
    return meta


def token_dtype(vocab: int) -> np.dtype[Any]:
    return np.dtype(np.uint16) if vocab <= 1 << 16 else np.dtype(np.uint32)


#: A local pretrained tokenizer's files, hashed into the token cache's key (a directory holds
#: some of them).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


def tokenizer_digests(data: DataSpec, spec_dir: Path | None) -> list[str]:
    """The content hashes of a local pretrained tokenizer's files (none for a hub tokenizer,
    which its commit names, nor for the bundled and trained ones, which the section names): the
    same path holding another tokenizer (a checkpoint replaced, two projects' ``./model``)
    must not reuse the tokens of the first."""
    from geospec.hub import locate
    from geospec.spec.sections import PretrainedTokenizer
    from geospec.storage.digests import file_digest

    spec = data.tokenizer
    if not isinstance(spec, PretrainedTokenizer):
        return []
    source = locate(spec.path, spec.revision, spec_dir or Path.cwd(), "data.tokenizer.path")
    if source.on_hub:
        return []
    path = source.path
    if path.is_file():  # a GGUF of many GB: named by its size and time, as the reference is
        stat = path.stat()
        return [f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}"]
    files = [path / name for name in TOKENIZER_FILES]
    return [f"{file.name}:{file_digest(file)}" for file in files if file.is_file()]


def cache_key(data: DataSpec, digests: list[str]) -> str:
    payload = json.dumps(
        {"format": FORMAT_VERSION, "data": data.key_form(), "files": digests},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def shared_cache_dir() -> Path:
    """The token cache every run on this machine shares: ``$GEOSPEC_CACHE/tokens``, else
    ``$XDG_CACHE_HOME/geospec/tokens`` (``~/.cache/geospec/tokens``). Specs whose data sections
    are equal (the 121m, 256m and 440m specs all read OpenWebText alike) tokenize once."""
    root = os.environ.get("GEOSPEC_CACHE")
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "geospec")
    return Path(root) / "tokens"


def partial_dir(cache_dir: Path, key: str) -> Path:
    """Where the tokens of ``key`` are built until they are complete (a dot name, never opened as
    a finished cache)."""
    return Path(cache_dir) / f".{key}.partial"


def prepare_data(
    data: DataSpec,
    cache_dir: Path,
    spec_dir: Path | None = None,
    say: Callable[[str], None] | None = None,
    earlier: Iterable[Path] = (),
    progress: bool = False,
) -> TokenData:
    """Tokenize and pack the corpus once; later calls (any process) open the cached result.

    Relative paths in ``data.files`` and ``data.tokenizer.path`` are taken from ``spec_dir``. A
    cache whose files no longer match its meta.json (length, content hash) is rebuilt, and
    ``say`` is told why. ``earlier``: cache directories where an earlier geospec may have built
    the same tokens (a run directory's ``data/``); a sound copy there is used as it is.
    ``progress``: tell ``say`` every few seconds how far the build is (documents, tokens, rate,
    ETA and the size the cache will take). A build that was killed resumes where it stopped.
    """
    corpus = Corpus(data, spec_dir)
    key = cache_key(data, corpus.digests() + tokenizer_digests(data, spec_dir))
    for directory in earlier:
        if (Path(directory) / key / META_FILE).exists():
            try:
                return TokenData.open(Path(directory) / key, verify=True)
            except DamagedCache:
                pass  # cache_dir serves the tokens (and rebuilds them there if need be)
    cache_dir = Path(cache_dir)
    final = cache_dir / key
    damaged = False
    if (final / META_FILE).exists():
        try:
            return TokenData.open(final, verify=True)
        except DamagedCache as error:
            damaged = True
            if say is not None:
                say(f"[yellow]![/] {error}; preparing the tokens again")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(cache_dir / f".{key}.lock"):
        if not damaged:
            try:
                return TokenData.open(final)  # another process may have built it meanwhile
            except DamagedCache:
                pass
        # a full disk: one line naming the cache; the partial build stays to resume from
        with writing(final):
            work = partial_dir(cache_dir, key)
            # scratch copies that killed builds of earlier geospec versions left (the builder
            # holds the lock; the partial build, resumable, stays)
            for stale in cache_dir.glob(f".{key}.*"):
                if stale.is_dir() and stale != work:
                    shutil.rmtree(stale, ignore_errors=True)
            reporter = None
            if progress and say is not None:
                reporter = DataProgress(say, corpus.documents_hint)
            try:
                _build(corpus, data, spec_dir, work, key, reporter)
            except GeospecError:  # bad input: nothing worth resuming
                shutil.rmtree(work, ignore_errors=True)
                raise
            (work / STATE_FILE).unlink()
            shutil.rmtree(final, ignore_errors=True)  # a damaged copy
            os.replace(work, final)
    return TokenData.open(final)


def _documents(corpus: Corpus) -> Iterator[tuple[list[str], ...]]:
    """(train documents, validation documents) per batch of the corpus (which are held out:
    :meth:`Corpus.held_out`, the seeded hash of each document's index)."""
    start = 0
    for batch in corpus.batches():
        is_val = corpus.held_out(np.arange(start, start + len(batch)))
        start += len(batch)
        yield (
            [t for t, v in zip(batch, is_val, strict=True) if not v],
            [t for t, v in zip(batch, is_val, strict=True) if v],
        )


def _resume_state(work: Path, key: str) -> dict[str, Any] | None:
    """How far an earlier build of ``key`` in ``work`` got, or None (then ``work`` is emptied):
    its tokenizer and the recorded length of each token file must be there."""
    try:
        state = json.loads((work / STATE_FILE).read_text())
        sizes = [(work / f"{name}.bin").stat().st_size for name in SPLITS]
        if (
            state["key"] == key
            and (work / "tokenizer.json").is_file()
            and all(size >= state["bytes"][n] for size, n in zip(sizes, SPLITS, strict=True))
        ):
            return dict(state)
    except (OSError, ValueError, TypeError, KeyError):
        pass
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    work.chmod(0o755)
    return None


def _build(
    corpus: Corpus,
    data: DataSpec,
    spec_dir: Path | None,
    work: Path,
    key: str,
    reporter: DataProgress | None = None,
) -> None:
    state = _resume_state(work, key)
    if state is None:

        def training_texts() -> Iterable[str]:
            for train_docs, _ in _documents(corpus):
                yield from train_docs

        built, eot = build_tokenizer(data.tokenizer, training_texts(), spec_dir)
        built.save(str(work / "tokenizer.json"))
        state = {"key": key, "eot": eot, "batches": 0}
        state |= {"documents": dict.fromkeys(SPLITS, 0), "tokens": dict.fromkeys(SPLITS, 0)}
        state["bytes"] = dict.fromkeys(SPLITS, 0)
    # encode with the saved tokenizer, as a resumed build must
    tokenizer = Tokenizer.from_file(str(work / "tokenizer.json"))
    eot = int(state["eot"])
    vocab = vocab_size(tokenizer)
    dtype = token_dtype(vocab)
    documents, tokens = state["documents"], state["tokens"]
    outputs: dict[str, IO[bytes]] = {}
    with contextlib.ExitStack() as files:
        for name in SPLITS:
            path = work / f"{name}.bin"
            path.touch()
            os.truncate(path, state["bytes"][name])  # what was written after the last record
            outputs[name] = files.enter_context(open(path, "ab"))
        if reporter is not None:
            reporter.start(sum(documents.values()), sum(tokens.values()), dtype.itemsize)
        for index, split_docs in enumerate(_documents(corpus)):
            if index < state["batches"]:
                continue  # written before the build was stopped
            for name, docs in zip(SPLITS, split_docs, strict=True):
                if docs:
                    packed = pack(tokenizer, docs, eot if data.end_of_text else None, dtype)
                    outputs[name].write(packed.tobytes())
                    documents[name] += len(docs)
                    tokens[name] += len(packed)
            state["batches"] = index + 1
            if state["batches"] % CHECKPOINT_BATCHES == 0:
                _record(work, state, outputs)
            if reporter is not None:
                reporter.update(sum(documents.values()), sum(tokens.values()))
        _record(work, state, outputs)
    if reporter is not None:
        reporter.finish(sum(documents.values()), sum(tokens.values()))
    for name in SPLITS:
        # val_fraction >= 0.5 only where nothing is trained (spec checks): no train split needed
        if tokens[name] == 0 and not (name == "train" and data.val_fraction >= 0.5):
            source = ", ".join(data.files) if data.files else data.corpus
            raise UsageError(
                f"data: the {name} split is empty ({source} gave {documents['train']} training "
                f"and {documents['val']} validation documents); use more data or change "
                "data.val_fraction"
            )
    meta: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "key": key,
        "vocab_size": vocab,
        "eot_id": eot,
        "dtype": dtype.name,
        "documents": documents,
        "tokens": tokens,
        "digests": {name: file_digest(work / f"{name}.bin") for name in SPLITS},
        "tokenizer": data.tokenizer.kind,
        "data": data.model_dump(mode="json"),
    }
    if isinstance(data.tokenizer, BPETokenizer) and vocab != data.tokenizer.vocab_size:
        meta["note"] = f"BPE stopped at {vocab} tokens: the corpus has too few distinct merges"
    (work / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def _record(work: Path, state: dict[str, Any], outputs: dict[str, IO[bytes]]) -> None:
    """Make what was written so far durable, then record it: a build killed after this resumes
    from here (the token files first, so the record never counts bytes that were lost)."""
    for name, handle in outputs.items():
        handle.flush()
        os.fsync(handle.fileno())
        state["bytes"][name] = handle.tell()
    atomic_write_json(work / STATE_FILE, state)


def pack(
    tokenizer: Tokenizer, docs: list[str], eot: int | None, dtype: np.dtype[Any]
) -> np.ndarray:
    """Token ids of ``docs`` concatenated, each document followed by ``eot`` (unless None)."""
    encodings = tokenizer.encode_batch_fast(docs, add_special_tokens=False)
    after = [] if eot is None else [eot]
    parts = [np.array([*encoding.ids, *after], dtype=dtype) for encoding in encodings]
    return np.concatenate(parts)
