"""The default corpus, bundled:mix (issue 56): novels, drama, code and modern prose in the shares
geospec.data.bundled gives, interleaved, its held-out part the pieces of the documents each
part's own split holds out (so no eval window of the mix or of a part is training text); and
what reads it by default."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from geospec.data.bundled import BUNDLED, MIX_CHARACTERS, PIECE_CHARACTERS
from geospec.engine.corpus import Corpus, bundled_documents, bundled_path
from geospec.engine.mix import Piece, cut, evenly_spaced, mix_pieces
from geospec.engine.split import split_fractions
from geospec.spec.sections import DataSpec

ROOT = Path(__file__).resolve().parents[1]
SEEDS = (0, 5)


# the pieces and the spacing, against their definitions


@given(
    blocks=st.lists(st.text(alphabet=st.sampled_from("ab \n"), max_size=30), max_size=12),
    size=st.integers(min_value=1, max_value=40),
)
def test_a_document_is_cut_at_the_first_blank_line_past_the_size(
    blocks: list[str], size: int
) -> None:
    document = "\n\n".join(blocks)
    pieces = cut(document, size)
    assert "\n\n".join(pieces) == document
    for piece in pieces[:-1]:  # every piece but the last ends at the first blank line past size
        assert len(piece) >= size and piece.find("\n\n", size) < 0
    assert pieces[-1].find("\n\n", size) < 0


@given(n=st.integers(1, 400), m=st.integers(0, 400))
def test_evenly_spaced_indices_have_even_gaps(n: int, m: int) -> None:
    taken = evenly_spaced(n, m)
    assert len(taken) == min(m, n) and taken == sorted(set(taken))
    assert all(0 <= i < n for i in taken)
    if 1 < m < n:
        gaps = np.diff(taken)
        assert gaps.min() >= n // m and gaps.max() <= -(-n // m)


# the real mix: every bundled file, [data]'s default split


@pytest.fixture(scope="module")
def texts() -> dict[str, str]:
    """Each bundled corpus's whole text, read from its file without geospec."""
    found = {}
    for name, corpus in BUNDLED.items():
        path = ROOT / "geospec" / "data" / corpus.file
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            found[name] = handle.read()
    return found


@pytest.fixture(scope="module")
def mixes() -> dict[int, list[Piece]]:
    documents = {name: bundled_documents(name) for name in MIX_CHARACTERS}
    return {seed: mix_pieces(documents, MIX_CHARACTERS, seed, 0.05) for seed in SEEDS}


def test_the_default_corpus_is_the_mix(mixes: dict[int, list[Piece]]) -> None:
    """No [data] source: the mix, every bundled file's digest keying its tokens, its pieces
    held out as they say."""
    corpus = Corpus(DataSpec())
    assert corpus.bundled == "mix"
    assert corpus.files == [bundled_path(name) for name in MIX_CHARACTERS]
    read = [d for batch in Corpus(DataSpec(max_documents=50)).batches() for d in batch]
    assert read == [p.text for p in mixes[0][:50]]
    flags = corpus.held_out(np.arange(len(mixes[0])))
    assert flags.tolist() == [p.held_out for p in mixes[0]] and 0 < flags.sum() < len(flags)


def test_every_piece_is_its_corpus_text_held_out_with_its_document(
    mixes: dict[int, list[Piece]], texts: dict[str, str]
) -> None:
    """Each piece is the piece of its index among its corpus's pieces (its file's documents,
    split at their headings, each cut as ``cut`` does: it joins back into the document), and it
    is held out exactly where [data]'s split (val_fraction 0.05) holds its document out of that
    corpus read alone: no text of a part's validation split is in the mix's training split, for
    either seed."""
    for seed, pieces in mixes.items():
        for name, text in texts.items():
            documents = [d for d in re.split(BUNDLED[name].documents, text) if d.strip()]
            held = split_fractions(np.arange(len(documents)), seed) < 0.05
            every = [(i, p) for i, d in enumerate(documents) for p in cut(d) if p.strip()]
            for piece in (p for p in pieces if p.corpus == name):
                document, expected = every[piece.index]
                assert piece.text == expected, (name, piece.index)
                assert piece.held_out == held[document], (seed, name, piece.index)


def test_each_kind_is_its_share_of_the_mix(mixes: dict[int, list[Piece]]) -> None:
    """2 million characters of each corpus (a quarter each of novels, drama, code and modern
    prose), to within 2%, from all through the corpus."""
    assert set(MIX_CHARACTERS) == {"austen", "shakespeare", "python-code", "python-docs"}
    assert {BUNDLED[n].kind for n in MIX_CHARACTERS} == {"novels", "drama", "code", "modern prose"}
    assert len(set(MIX_CHARACTERS.values())) == 1  # equal shares
    characters: Counter[str] = Counter()
    for piece in mixes[0]:
        characters[piece.corpus] += len(piece.text)
    for name, wanted in MIX_CHARACTERS.items():
        assert abs(characters[name] - wanted) <= 0.02 * wanted, name
        indices = [p.index for p in mixes[0] if p.corpus == name]
        every = len([p for d in bundled_documents(name) for p in cut(d) if p.strip()])
        assert max(indices) >= 0.95 * every and min(indices) <= 0.05 * every  # start to end


def test_the_held_out_part_is_the_mix(mixes: dict[int, list[Piece]]) -> None:
    """With the default split, about 5% of the mix is held out, a quarter of it from each corpus
    (each corpus's held-out documents hold more than its share); another seed holds out other
    pieces."""
    pieces = mixes[0]
    characters: Counter[str] = Counter()
    for piece in pieces:
        characters[piece.corpus] += len(piece.text) * piece.held_out
    held = sum(characters.values())
    assert 0.045 < held / sum(len(p.text) for p in pieces) < 0.055
    for name in MIX_CHARACTERS:
        assert 0.23 < characters[name] / held < 0.27, name
    other = {(p.corpus, p.index) for p in mixes[SEEDS[1]] if p.held_out}
    assert {(p.corpus, p.index) for p in pieces if p.held_out} != other


def test_every_stretch_of_each_part_is_the_mix(mixes: dict[int, list[Piece]]) -> None:
    """In every prefix of the held-out part and of the training part, each corpus's characters
    are its share of the prefix's to within two of its longest pieces; and the first and the
    last 16,000 characters of the held-out part (what the eval and selection windows read)
    hold every kind."""
    pieces = mixes[0]
    for part in (True, False):
        chosen = [p for p in pieces if p.held_out == part]
        names = list(MIX_CHARACTERS)
        lengths = np.array([[len(p.text) * (p.corpus == n) for n in names] for p in chosen])
        totals = lengths.sum(axis=0)
        longest = lengths.max(axis=0)
        prefix = lengths.cumsum(axis=0)
        expected = prefix.sum(axis=1, keepdims=True) * totals / totals.sum()
        assert (np.abs(prefix - expected) <= 2 * longest).all(), part
        if part:
            for stretch in (chosen, chosen[::-1]):
                ends = np.cumsum([len(p.text) for p in stretch])
                within = stretch[: int(np.searchsorted(ends, 16_000)) + 1]
                assert {p.corpus for p in within} == set(names)


def test_the_mix_is_the_same_in_every_process() -> None:
    """Built in two fresh interpreters (each its own hash seed), the same documents."""
    program = (
        "import hashlib\nfrom geospec.engine.corpus import Corpus\n"
        "from geospec.spec.sections import DataSpec\n"
        "h = hashlib.sha256()\n"
        "for batch in Corpus(DataSpec(split_seed=3)).batches():\n"
        "    for d in batch: h.update(d.encode())\nprint(h.hexdigest())"
    )
    digests = set()
    for seed in (1, 2):
        environment = dict(os.environ, PYTHONHASHSEED=str(seed))
        run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                             check=True, env=environment)  # fmt: skip
        digests.add(run.stdout)
    assert len(digests) == 1


def test_the_bundled_files_are_the_ones_their_manifest_records() -> None:
    """python-code and python-docs: the bytes scripts/bundled_corpora.py wrote (its manifest),
    one document per module and per page, each file under 2 MB."""
    manifest = json.loads((ROOT / "geospec" / "data" / "bundled-corpora.json").read_text())
    for name in ("python-code", "python-docs"):
        path = bundled_path(name)
        entry = manifest[path.name]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
        assert path.stat().st_size < 2_000_000
        documents = bundled_documents(name)
        assert len(documents) == len(entry["documents"])
        assert sum(len(d) for d in documents) >= MIX_CHARACTERS[name]
    code = bundled_documents("python-code")
    for document, module in zip(code, manifest["python-code.txt.gz"]["documents"], strict=True):
        assert document.startswith(f"# {module}\n")
        compile(document, module, "exec")  # each document is a whole module
    assert not any("<pre" in d or "&gt;" in d for d in bundled_documents("python-docs"))


def test_pieces_are_about_the_piece_size(mixes: dict[int, list[Piece]]) -> None:
    lengths = [len(p.text) for p in mixes[0]]
    assert np.median(lengths) >= PIECE_CHARACTERS and np.median(lengths) < 2 * PIECE_CHARACTERS


# what reads the mix by default


def test_the_default_is_named_in_keys_and_explicit_sources_key_as_before() -> None:
    """A spec without [data] keys as the mix, not as the Austen default it once had (no source
    in the key); a spec naming its source keys exactly as before (the key is its fields)."""
    from geospec.data import bundled

    assert DataSpec().key_form()["source"] == "bundled:mix"
    assert DataSpec().key_form() == DataSpec(source="bundled:mix").key_form()
    before = DataSpec().key_form()
    for name, other in (("MIX_CHARACTERS", dict.fromkeys(bundled.MIX_CHARACTERS, 10**6)),
                        ("PIECE_CHARACTERS", 1_000), ("MIX_LAYOUT", 2)):  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:  # another mix is another text: another key
            patch.setattr(bundled, name, other)
            assert DataSpec().key_form() != before, name
    from geospec.spec.sections import Section

    austen = DataSpec(source="bundled:austen")
    assert austen.key_form() == Section.key_form(austen)  # as every section keys
    assert austen.key_form()["source"] == "bundled:austen" != DataSpec().key_form()["source"]
    assert DataSpec(files=["a.txt"]).key_form()["source"] is None


def test_validate_says_what_the_default_reads(tmp_path: Path) -> None:
    import tomlkit
    from click.testing import CliRunner

    from geospec.cli import cli
    from geospec.testing import minimal_spec

    spec = tmp_path / "spec.toml"
    spec.write_text(tomlkit.dumps(minimal_spec()))
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())  # the table's rows wrapped to the terminal
    kinds = ", ".join(f"{name} ({corpus.kind}) 25%" for name, corpus in BUNDLED.items())
    assert f"data bundled:mix (the default): {kinds} of 8M characters" in shown
    data = {"tokenizer": {"kind": "bpe", "vocab_size": 512}, "source": "bundled:mixx"}
    spec.write_text(tomlkit.dumps(minimal_spec(data=data)))
    result = CliRunner().invoke(cli, ["validate", str(spec)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "data.source: no bundled corpus 'bundled:mixx'" in result.output


@pytest.fixture(scope="module")
def mix_tokens(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """[data] without a source (GPT-2's tokenizer), its tokens and how any data section's are
    prepared in the same cache (as the prune stage's shared token cache does)."""
    from geospec.engine.token_data import prepare_data

    cache = tmp_path_factory.mktemp("cache")
    data = DataSpec(tokenizer={"kind": "gpt2"})
    return data, prepare_data(data, cache), lambda other: prepare_data(other, cache)


@pytest.mark.torch
def test_the_validation_tokens_are_the_held_out_pieces(
    mix_tokens: Any, mixes: dict[int, list[Piece]]
) -> None:
    """The token cache's validation split is the held-out pieces, each tokenized by GPT-2's
    tokenizer and followed by its end-of-text token, in the order the mix lays them out; the
    training split the other pieces."""
    from geospec.engine.tokenizer import gpt2_tokenizer

    _, found, _ = mix_tokens
    tokenizer = gpt2_tokenizer()
    for split, part in (("val", True), ("train", False)):
        texts = [p.text for p in mixes[0] if p.held_out == part]
        ids = [t for e in tokenizer.encode_batch(texts) for t in [*e.ids, 50256]]
        assert np.array_equal(getattr(found, split), np.array(ids, dtype=np.uint16)), split


@pytest.mark.torch
def test_the_default_eval_is_the_mix_held_out_apart_from_the_selection_windows(
    mix_tokens: Any,
) -> None:
    """A prune without eval corpora scores the mix's held-out part, which is [data]'s own
    text: the selection windows are its last ones and are refused where they would reach the
    eval's first windows (one line naming both)."""
    from geospec.errors import UsageError
    from geospec.prune.corpora import eval_data
    from geospec.prune.select import select_batches
    from geospec.spec.sections import PruneSpec

    data, found, token_data = mix_tokens
    arms = [{"name": "uniform", "schedule": {"kind": "uniform"}}]
    prune = PruneSpec.model_validate({"arms": arms, "select": {"windows": 8}})
    assert prune.eval.corpora == ["bundled:mix"]
    assert eval_data(data, "bundled:mix").key_form() == data.key_form()  # the same tokens
    windows = len(found.val) // 256
    fits = prune.model_copy(update={"eval": prune.eval.model_copy(update={"windows": 8})})
    assert len(select_batches(fits, data, 256, token_data, "cpu")) == 2  # 8 in batches of 4
    eval_too_many = prune.eval.model_copy(update={"windows": windows - 4})
    crowded = prune.model_copy(update={"eval": eval_too_many})
    with pytest.raises(UsageError, match=re.escape(f"after the {windows - 4} eval windows of "
                                                   "'bundled:mix'")):  # fmt: skip
        select_batches(crowded, data, 256, token_data, "cpu")


def test_every_committed_study_names_its_text() -> None:
    """The specs of the studies under docs/results name [data]'s text and their eval corpora,
    so the default's change leaves their keys (and so their results) as they were."""
    import tomllib

    studies = [path.name for path in (ROOT / "docs" / "results").iterdir() if path.is_dir()]
    specs = [ROOT / "specs" / f"{name}.toml" for name in studies]
    assert len([spec for spec in specs if spec.is_file()]) >= 15
    for spec in specs:
        if not spec.is_file():
            continue
        raw = tomllib.loads(spec.read_text())
        data = raw.get("data", {})
        assert "source" in data or "files" in data, spec.name
        if "prune" in raw:
            assert "corpora" in raw["prune"].get("eval", {}), spec.name


def grams(tokens: np.ndarray, n: int = 64) -> np.ndarray:
    """A hash of every stretch of ``n`` tokens (a polynomial over the ids, modulo 2^64)."""
    ids = tokens.astype(np.uint64)
    hashes = np.zeros(len(ids) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            hashes = hashes * np.uint64(1_000_003) + ids[i : len(ids) - n + 1 + i]
    return hashes


@pytest.mark.torch
def test_no_eval_window_of_a_part_is_mix_training_text(mix_tokens: Any) -> None:
    """Calibrating on the mix and scoring a part of it alone (the committed studies score
    bundled:austen and bundled:shakespeare): no 64-token stretch of their eval windows (the
    first 32 of 256 tokens of each one's validation split) is in the mix's training split. The
    control: the first windows of their training splits are (the check sees shared text)."""
    from geospec.prune.corpora import eval_data

    data, found, token_data = mix_tokens
    training = np.unique(grams(found.train))
    for name in ("bundled:austen", "bundled:shakespeare"):
        alone = token_data(eval_data(data, name))
        assert not np.isin(grams(alone.val[: 32 * 256 + 1]), training).any(), name
        assert np.isin(grams(alone.train[: 32 * 256 + 1]), training).any(), name
