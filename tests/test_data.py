"""Data: corpora through datasets, tokenizers, deterministic split, packing, batches."""

from __future__ import annotations

import base64
import bz2
import gzip
import io
import json
import lzma
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from geospec.engine.batches import TrainOrder, validation_windows, window_tensors
from geospec.engine.corpus import Corpus
from geospec.engine.token_data import prepare_data, split_fractions, token_dtype
from geospec.engine.tokenizer import EOT, gpt2_tokenizer
from geospec.errors import UsageError
from geospec.spec.sections import DataSpec

pytestmark = pytest.mark.torch

R50K = Path(__file__).resolve().parent / "fixtures" / "r50k_base.tiktoken.gz"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def _documents(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [
        " ".join(rng.choice(WORDS, size=int(rng.integers(5, 40)))) + f" doc{i}." for i in range(n)
    ]


def _jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


# -- tokenizers ---------------------------------------------------------------------------------


def test_gpt2_known_encoding() -> None:
    tokenizer = gpt2_tokenizer()
    assert tokenizer.encode("Hello world").ids == [15496, 995]
    assert tokenizer.token_to_id(EOT) == 50256
    assert tokenizer.get_vocab_size() == 50257


def test_gpt2_matches_transformers_on_real_text() -> None:
    from transformers import GPT2Tokenizer

    batches = Corpus(DataSpec(source="bundled:shakespeare", max_documents=3)).batches()
    text = "".join(next(batches))
    directory = Path(__file__).resolve().parents[1] / "geospec" / "data" / "gpt2"
    vocab = json.loads((directory / "vocab.json").read_text())
    merges = [
        tuple(line.split())
        for line in (directory / "merges.txt").read_text().splitlines()[1:]
        if line
    ]
    reference = GPT2Tokenizer(vocab=vocab, merges=merges)
    assert gpt2_tokenizer().encode(text).ids == reference.encode(text)


def test_gpt2_ids_are_the_r50k_ranks() -> None:
    """tiktoken's r50k_base ranks (an independent file, OpenAI's publication of GPT-2's
    vocabulary, kept in tests/fixtures) decode our ids back to the text."""
    ranks = {}
    with gzip.open(R50K, "rt", encoding="ascii") as file:
        lines = file.read().splitlines()
    assert len(lines) == 50256  # every id but the end-of-text token
    for line in lines:
        token, rank = line.split()
        ranks[int(rank)] = base64.b64decode(token)
    text = "It is a truth universally acknowledged — naïve café, 1234 tokens!\n\n\tEnd."
    ids = gpt2_tokenizer().encode(text).ids
    assert b"".join(ranks[i] for i in ids) == text.encode("utf-8")


def test_trained_bpe_round_trips(tmp_path: Path) -> None:
    docs = _documents(300)
    data = DataSpec(
        files=[str(_jsonl(tmp_path / "d.jsonl", docs))],
        tokenizer={"kind": "bpe", "vocab_size": 300, "min_frequency": 1},
    )
    prepared = prepare_data(data, tmp_path / "cache")
    tokenizer = prepared.tokenizer()
    assert prepared.vocab_size == tokenizer.get_vocab_size() <= 300
    assert prepared.eot_id == tokenizer.token_to_id(EOT) == 0
    sample = "gamma délta — ωμέγα 42\n"  # bytes never seen in training still round-trip
    assert tokenizer.decode(tokenizer.encode(sample).ids) == sample


def test_pretrained_tokenizer_directory_with_a_large_vocabulary(tmp_path: Path) -> None:
    """A transformers tokenizer directory; > 65536 ids are stored as uint32."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1} | {f"w{i}": i + 2 for i in range(70_000)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]"
    ).save_pretrained(tmp_path / "tok")
    rng = np.random.default_rng(1)
    docs = [" ".join(f"w{j}" for j in rng.integers(0, 70_000, 20)) for _ in range(40)]
    data = DataSpec(
        files=[str(_jsonl(tmp_path / "d.jsonl", docs))],
        val_fraction=0.2,
        tokenizer={"kind": "pretrained", "path": "tok"},
    )
    prepared = prepare_data(data, tmp_path / "cache", spec_dir=tmp_path)
    assert prepared.train.dtype == np.uint32 and prepared.eot_id == 1
    assert prepared.vocab_size == 70_002
    everything = np.concatenate([prepared.train, prepared.val])
    assert everything.max() > 65535
    expected = sum(len(d.split()) + 1 for d in docs)
    assert len(everything) == expected


def test_token_dtype() -> None:
    assert token_dtype(50257) == np.uint16
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


# -- split and packing --------------------------------------------------------------------------


def test_split_is_seeded_and_has_the_requested_fraction() -> None:
    indices = np.arange(200_000)
    a = split_fractions(indices, seed=3)
    assert np.array_equal(a, split_fractions(indices, seed=3))
    assert not np.array_equal(a, split_fractions(indices, seed=4))
    # independent of how documents are batched
    assert np.array_equal(a[1000:1500], split_fractions(indices[1000:1500], seed=3))
    fraction = float(np.mean(a < 0.05))
    assert abs(fraction - 0.05) < 5 * np.sqrt(0.05 * 0.95 / len(indices))
    assert a.min() >= 0.0 and a.max() < 1.0


def test_packing_puts_eot_after_every_document(tmp_path: Path) -> None:
    docs = _documents(200)
    data = DataSpec(
        files=[str(_jsonl(tmp_path / "d.jsonl", docs))],
        val_fraction=0.25,
        split_seed=7,
        tokenizer={"kind": "gpt2"},
    )
    prepared = prepare_data(data, tmp_path / "cache")
    assert prepared.train.dtype == np.uint16
    tokenizer = gpt2_tokenizer()
    is_val = split_fractions(np.arange(len(docs)), 7) < 0.25
    for split, tokens in (("val", prepared.val), ("train", prepared.train)):
        chosen = [d for d, v in zip(docs, is_val, strict=True) if v == (split == "val")]
        expected = [t for d in chosen for t in [*tokenizer.encode(d).ids, 50256]]
        assert tokens.tolist() == expected
        assert int(np.sum(tokens == 50256)) == len(chosen) == prepared.meta["documents"][split]


def test_prepared_data_is_cached_and_keyed_by_content(tmp_path: Path) -> None:
    source = _jsonl(tmp_path / "d.jsonl", _documents(100))
    data = DataSpec(files=[str(source)], val_fraction=0.2, tokenizer={"kind": "gpt2"})
    first = prepare_data(data, tmp_path / "cache")
    stamp = os.stat(first.directory / "train.bin").st_mtime_ns
    again = prepare_data(data, tmp_path / "cache")
    assert again.directory == first.directory
    assert os.stat(again.directory / "train.bin").st_mtime_ns == stamp
    # a rebuild elsewhere gives byte-identical tokens (validation tokens equal for every run)
    elsewhere = prepare_data(data, tmp_path / "other")
    assert elsewhere.key == first.key
    assert (elsewhere.directory / "val.bin").read_bytes() == (
        first.directory / "val.bin"
    ).read_bytes()
    reseeded = prepare_data(data.model_copy(update={"split_seed": 1}), tmp_path / "cache")
    assert reseeded.key != first.key and not np.array_equal(reseeded.val, first.val)
    _jsonl(source, _documents(100, seed=5))  # changed file content: new key, new tokens
    assert prepare_data(data, tmp_path / "cache").key != first.key
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir() and p.name[0] == "."]
    assert leftovers == []


def test_scratch_copies_of_a_killed_build_are_removed_by_the_next(tmp_path: Path) -> None:
    """A process SIGKILLed while it tokenizes leaves its scratch directory; the next build of
    the same tokens (holding the lock, so the only builder) removes it: a full disk is not
    filled by kills."""
    source = _jsonl(tmp_path / "d.jsonl", _documents(50))
    data = DataSpec(files=[str(source)], val_fraction=0.2, tokenizer={"kind": "gpt2"})
    key = prepare_data(data, tmp_path / "first").key
    killed = tmp_path / "cache" / f".{key}.k1ll3d"
    (killed / "train.bin").parent.mkdir(parents=True)
    (killed / "train.bin").write_bytes(b"\0" * 4096)
    other = tmp_path / "cache" / ".0123456789abcdef.k1ll3d"  # another key's: left alone
    other.mkdir()
    prepare_data(data, tmp_path / "cache")
    assert not killed.exists() and other.exists()


def test_empty_validation_split_is_a_clear_error(tmp_path: Path) -> None:
    data = DataSpec(
        files=[str(_jsonl(tmp_path / "d.jsonl", _documents(3)))],
        val_fraction=0.01,
        tokenizer={"kind": "gpt2"},
    )
    with pytest.raises(UsageError, match="val split is empty"):
        prepare_data(data, tmp_path / "cache")


# -- corpora ------------------------------------------------------------------------------------


def test_bundled_corpora_split_into_chapters_and_scenes() -> None:
    chapters = [d for batch in Corpus(DataSpec(source="bundled:austen")).batches() for d in batch]
    assert 250 <= len(chapters) <= 300
    assert sum(d.lstrip().upper().startswith("CHAPTER") for d in chapters) >= len(chapters) - 6
    scenes = [d for b in Corpus(DataSpec(source="bundled:shakespeare")).batches() for d in b]
    assert len(scenes) >= 700
    assert sum(d.startswith("### SCENE") for d in scenes) >= len(scenes) - 45


def test_local_text_jsonl_and_parquet_files(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("first paragraph\nstill first\n\nsecond paragraph\n\n\n")
    _jsonl(tmp_path / "b.jsonl", ["from json", ""], field="body")
    pq.write_table(pa.table({"body": ["from parquet"]}), tmp_path / "c.parquet")
    texts = Corpus(DataSpec(files=["a.txt"]), spec_dir=tmp_path)
    assert [d.strip() for b in texts.batches() for d in b] == [
        "first paragraph\nstill first",
        "second paragraph",
    ]
    rows = Corpus(DataSpec(files=["b.jsonl", "c.parquet"], text_field="body"), spec_dir=tmp_path)
    assert [d for b in rows.batches() for d in b] == ["from json", "from parquet"]
    limited = Corpus(
        DataSpec(files=["a.txt", "b.jsonl"], text_field="body", max_documents=1), spec_dir=tmp_path
    )
    assert len([d for b in limited.batches() for d in b]) == 1


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"data.files\[0\].*not found"):
        Corpus(DataSpec(files=["missing.txt"]), spec_dir=tmp_path)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(UsageError, match="unsupported extension"):
        Corpus(DataSpec(files=["x.csv"]), spec_dir=tmp_path)
    _jsonl(tmp_path / "d.jsonl", ["x"], field="body")
    with pytest.raises(UsageError, match=r"no column 'text'.*body"):
        list(Corpus(DataSpec(files=["d.jsonl"]), spec_dir=tmp_path).batches())
    with pytest.raises(UsageError, match="unknown bundled corpus"):
        Corpus(DataSpec(source="bundled:milton"))


# -- batches ------------------------------------------------------------------------------------


def test_train_order_is_a_permutation_per_epoch_from_the_seed_only() -> None:
    order = TrainOrder(n_tokens=1001, seq_len=10, seed=5)  # 100 windows
    epochs = order.windows(0, 300)
    for e in range(3):
        assert sorted(epochs[100 * e : 100 * (e + 1)].tolist()) == list(range(100))
    assert not np.array_equal(epochs[:100], epochs[100:200])
    pieces = np.concatenate([TrainOrder(1001, 10, 5).windows(s, 7) for s in range(0, 294, 7)])
    assert np.array_equal(pieces, epochs[:294])
    assert not np.array_equal(TrainOrder(1001, 10, 6).windows(0, 100), epochs[:100])


def test_windows_give_next_token_targets() -> None:
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = window_tensors(tokens, np.array([0, 3]), seq_len=8)
    assert x.tolist() == [list(range(0, 8)), list(range(24, 32))]
    assert y.tolist() == [list(range(1, 9)), list(range(25, 33))]
    assert validation_windows(1000, 8, None).tolist() == list(range(124))
    assert validation_windows(1000, 8, 40).tolist() == list(range(5))
    with pytest.raises(UsageError, match="validation split has 5 tokens"):
        validation_windows(5, 8, None)


# -- text without datasets ----------------------------------------------------------------------

TRICKY = (
    "\ufeffFirst block, Windows lines\r\nstill first\r\n\r\nsecond\rold Mac line\r\r"
    "\n\n\nthird after a run of blank lines\n  \n\n  \n\nλόγος, naïve — 42\n\n"
    "last block without a newline"
)


def _datasets_texts(path: Path, sample_by: str, cache: Path) -> list[str]:
    """What datasets' text builder reads from ``path`` (the reference: the reader geospec used)."""
    import datasets

    dataset = datasets.load_dataset(
        "text", data_files=str(path), split="train", cache_dir=str(cache), sample_by=sample_by
    )
    return list(dataset["text"])


def _documents_of(corpus: Corpus) -> list[str]:
    return [d for batch in corpus.batches() for d in batch]


@pytest.mark.parametrize("name", ["austen", "shakespeare", "python-code", "python-docs"])
def test_bundled_corpora_read_as_datasets_read_them(name: str, tmp_path: Path) -> None:
    from geospec.engine.corpus import BUNDLED, bundled_path

    (text,) = _datasets_texts(bundled_path(name), "document", tmp_path)
    expected = [d for d in re.split(BUNDLED[name][1], text) if d.strip()]
    assert _documents_of(Corpus(DataSpec(source=f"bundled:{name}"))) == expected


@pytest.mark.parametrize("suffix", [".txt", ".txt.gz", ".txt.bz2", ".txt.xz"])
def test_text_files_read_as_datasets_reads_them(suffix: str, tmp_path: Path) -> None:
    opener = {".txt": open, ".txt.gz": gzip.open, ".txt.bz2": bz2.open, ".txt.xz": lzma.open}
    path = tmp_path / f"doc{suffix}"
    with opener[suffix](path, "wb") as handle:
        handle.write(TRICKY.encode("utf-8"))
    expected = [d for d in _datasets_texts(path, "paragraph", tmp_path / "cache") if d.strip()]
    assert len(expected) >= 4
    assert _documents_of(Corpus(DataSpec(files=[path.name]), spec_dir=tmp_path)) == expected


@given(
    text=st.text(alphabet=st.sampled_from("ab \n\r"), max_size=80),
    chunk=st.integers(min_value=1, max_value=9),
)
def test_paragraphs_read_in_chunks_are_the_blocks_of_the_whole_text(text: str, chunk: int) -> None:
    from geospec.engine.corpus import _paragraphs

    whole = io.StringIO(text, newline=None).read()  # universal newlines, as a text file
    blocks = list(_paragraphs(io.StringIO(text, newline=None), chunk_size=chunk))
    assert blocks == [block for block in whole.split("\n\n") if block]


def test_token_cache_is_byte_identical_to_the_datasets_reading(tmp_path: Path) -> None:
    """The packed tokens of a bundled corpus and of a .txt.gz file, against tokens built from the
    documents datasets reads (split by the same seeded hash, GPT-2 ids, EOT after each)."""
    from geospec.engine.corpus import BUNDLED, bundled_path

    (text,) = _datasets_texts(bundled_path("shakespeare"), "document", tmp_path / "c1")
    scenes = [d for d in re.split(BUNDLED["shakespeare"][1], text) if d.strip()][:60]
    with gzip.open(tmp_path / "notes.txt.gz", "wb") as handle:
        handle.write(("\n\n".join(scenes[:25]) + "\r\n\r\n" + TRICKY).encode("utf-8"))
    notes = _datasets_texts(tmp_path / "notes.txt.gz", "paragraph", tmp_path / "c2")
    blocks = [d for d in notes if d.strip()]
    tokenizer = gpt2_tokenizer()
    common: dict[str, Any] = {"val_fraction": 0.2, "tokenizer": {"kind": "gpt2"}}
    for data, documents in (
        (DataSpec(source="bundled:shakespeare", max_documents=60, **common), scenes),
        (DataSpec(files=["notes.txt.gz"], **common), blocks),
    ):
        prepared = prepare_data(data, tmp_path / "cache", spec_dir=tmp_path)
        is_val = split_fractions(np.arange(len(documents)), data.split_seed) < 0.2
        for split in ("train", "val"):
            chosen = [d for d, v in zip(documents, is_val, strict=True) if v == (split == "val")]
            ids = [t for d in chosen for t in [*tokenizer.encode(d).ids, 50256]]
            expected = np.array(ids, dtype=np.uint16).tobytes()
            assert (prepared.directory / f"{split}.bin").read_bytes() == expected


@pytest.mark.parametrize("prefetch", [False, True])
def test_step_batches_hold_this_process_share_of_each_step(prefetch: bool) -> None:
    """Step s, rank r of 2 (batch 6, 3 sequences each): the windows of global sequences
    6s + 3r .. 6s + 3r + 2, read ahead or not, from the first step or from a resumed one."""
    import torch

    from geospec.engine.batches import StepBatches

    tokens = np.arange(2000, dtype=np.uint16)
    order = TrainOrder(len(tokens), seq_len=10, seed=4)
    for start in (0, 7):  # a fresh run, and one resumed at step 7
        batches = StepBatches(
            tokens, TrainOrder(len(tokens), 10, 4), seq_len=10, batch_size=6, first=3, count=3,
            steps=40, device=torch.device("cpu"), prefetch=prefetch,
        )  # fmt: skip
        for step in range(start, 40):
            batch = batches.get(step)
            assert batch.dtype == torch.int64 and batch.shape == (3, 11)
            for row, sequence in zip(batch, range(6 * step + 3, 6 * step + 6), strict=True):
                window = int(order.windows(sequence, 1)[0])
                assert row.tolist() == list(range(10 * window, 10 * window + 11))


def test_specs_with_the_same_data_share_one_token_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two run directories, one data section: tokenized once, in the shared cache; a run directory
    whose data/ an earlier geospec filled keeps reading its own copy."""
    from rich.console import Console

    from geospec.engine.distributed import DistContext
    from geospec.engine.token_data import shared_cache_dir
    from geospec.pipeline.context import RunContext

    monkeypatch.setenv("GEOSPEC_CACHE", str(tmp_path / "cache"))
    assert shared_cache_dir() == tmp_path / "cache" / "tokens"
    data = DataSpec(source="bundled:austen", max_documents=20, tokenizer={"kind": "gpt2"})

    def run(name: str) -> RunContext:
        return RunContext(tmp_path / name, tmp_path, Console(quiet=True), DistContext())

    first = run("121m").token_data(data)
    assert first.directory.parent == tmp_path / "cache" / "tokens"
    stamp = os.stat(first.directory / "train.bin").st_mtime_ns
    second = run("256m").token_data(data)
    assert second.directory == first.directory
    assert os.stat(second.directory / "train.bin").st_mtime_ns == stamp  # not rebuilt
    assert not (tmp_path / "121m" / "data").exists() and not (tmp_path / "256m" / "data").exists()
    # a run directory of an earlier version, whose tokens lie in its own data/
    legacy = prepare_data(data, tmp_path / "old" / "data")
    assert run("old").token_data(data).directory == legacy.directory
    monkeypatch.delenv("GEOSPEC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert shared_cache_dir() == tmp_path / "xdg" / "geospec" / "tokens"


def test_another_tokenizer_at_the_same_path_is_tokenized_again(tmp_path: Path) -> None:
    """Two projects' ./model (or a checkpoint replaced in place) hold different tokenizers at
    the same relative path: the second must not reuse the first one's tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from geospec.engine.token_data import prepare_data
    from geospec.spec.sections import DataSpec

    text = tmp_path / "docs.txt"
    text.write_text("\n\n".join("a b c a b" for _ in range(50)))
    tokens = {}
    for order in ("abc", "cba"):
        project = tmp_path / order
        vocab = {"[UNK]": 0, "</s>": 1} | {word: i + 2 for i, word in enumerate(order)}
        backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>").save_pretrained(
            project / "model"
        )
        data = DataSpec(files=[str(text)], tokenizer={"kind": "pretrained", "path": "model"})
        prepared = prepare_data(data, tmp_path / "cache", spec_dir=project)
        tokens[order] = list(prepared.train[:3]) + list(prepared.val[:3])
    assert tokens["abc"][:3] == [2, 3, 4] and tokens["cba"][:3] == [4, 3, 2]
