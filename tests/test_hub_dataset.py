"""Hub datasets offline: a parquet revision in a Hugging Face cache built with huggingface_hub's
own cache-writing functions, read by geospec's data code with HF_HUB_OFFLINE=1, gives the
documents and tokens of the same files read as local files; every way it can fail is one line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from geospec.engine.corpus import Corpus
from geospec.engine.hub_dataset import PARQUET_REVISION, load_problem
from geospec.errors import UsageError
from geospec.spec.loading import load_spec
from geospec.spec.sections import DataSpec

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parents[1]
REPO = "someone/webtext"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def texts(count: int, offset: int = 0) -> list[str]:
    return [
        f"Document {i}: " + " ".join(f"word{(i * 7 + j) % 53}" for j in range(5 + i % 11))
        for i in range(offset, offset + count)
    ]


def write_parquet(path: Path, rows: list[str], column: str = "text") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({column: rows}), path)


def cache_files(cache: Path, repo_id: str, files: Path, commit: str, revision: str) -> None:
    """Every file under ``files`` as ``commit`` of dataset ``repo_id`` in the Hugging Face cache,
    ``revision`` pointing at it: written by huggingface_hub's own functions, as a download would
    (blobs named by content hash, snapshot links to them, the ref file)."""
    from huggingface_hub.file_download import (
        _cache_commit_hash_for_specific_revision,
        _create_symlink,
        repo_folder_name,
    )

    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="dataset")
    for file in sorted(p for p in files.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = storage / "snapshots" / commit / file.relative_to(files)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob), str(pointer), new_blob=False)
    _cache_commit_hash_for_specific_revision(str(storage), revision, commit)


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache holding REPO's parquet conversion (two files of the train split, as the hub
    lays it out: <config>/<split>/NNNN.parquet) at refs/convert/parquet; HF_HUB_OFFLINE=1 and
    HF_HUB_CACHE set on huggingface_hub's constants (read once, at import)."""
    from huggingface_hub import constants, scan_cache_dir

    files = tmp_path / "files"
    write_parquet(files / "plain_text" / "train" / "0000.parquet", texts(120))
    write_parquet(files / "plain_text" / "train" / "0001.parquet", texts(90, offset=120))
    cache = tmp_path / "cache"
    cache_files(cache, REPO, files, COMMIT, PARQUET_REVISION)
    # huggingface_hub's own cache reader sees the dataset, its commit, its ref and both files
    (repo,) = scan_cache_dir(cache).repos
    (revision,) = repo.revisions
    assert (repo.repo_id, repo.repo_type, revision.commit_hash) == (REPO, "dataset", COMMIT)
    assert revision.refs == frozenset({PARQUET_REVISION}) and repo.nb_files == 2
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return tmp_path


def documents(data: DataSpec, spec_dir: Path | None = None) -> list[str]:
    return [text for batch in Corpus(data, spec_dir).batches(size=50) for text in batch]


def test_a_cached_parquet_revision_reads_as_its_files(hub_cache: Path) -> None:
    hub = DataSpec(source=REPO, hub_revision=PARQUET_REVISION)
    assert documents(hub) == texts(210)  # the rows pyarrow wrote, in file order
    files = sorted(str(p) for p in (hub_cache / "files").rglob("*.parquet"))
    assert documents(DataSpec(files=files)) == texts(210)
    assert documents(DataSpec(source=REPO, hub_revision=COMMIT, max_documents=7)) == texts(7)


def test_tokens_of_the_cached_revision_equal_those_of_the_same_local_files(hub_cache: Path) -> None:
    from geospec.engine.token_data import prepare_data

    common = {"tokenizer": {"kind": "gpt2"}, "val_fraction": 0.2}
    hub = DataSpec(source=REPO, hub_revision=PARQUET_REVISION, **common)
    files = sorted(str(p) for p in (hub_cache / "files").rglob("*.parquet"))
    local = DataSpec(files=files, **common)
    from_hub = prepare_data(hub, hub_cache / "tokens")
    from_files = prepare_data(local, hub_cache / "tokens")
    assert from_hub.key != from_files.key  # different data sections, different caches
    for split in ("train", "val"):
        a = (from_hub.directory / f"{split}.bin").read_bytes()
        assert a and a == (from_files.directory / f"{split}.bin").read_bytes()


def test_the_shipped_specs_read_the_openwebtext_conversion_as_written(
    hub_cache: Path,
) -> None:
    """The paper's specs name no config and the parquet revision: with the conversion's layout
    (plain_text/train/NNNN.parquet) in the cache they read its rows, offline."""
    files = hub_cache / "owt"
    write_parquet(files / "plain_text" / "train" / "0000.parquet", texts(30))
    from huggingface_hub import constants

    cache_files(
        Path(constants.HF_HUB_CACHE), "Skylion007/openwebtext", files, COMMIT, PARQUET_REVISION
    )
    for name in ("121m", "256m", "440m"):
        data = load_spec(ROOT / "specs" / f"{name}.toml").data
        assert data.hub_revision == PARQUET_REVISION
        assert documents(data) == texts(30)


def problem(data: DataSpec) -> str:
    with pytest.raises(UsageError) as caught:
        documents(data)
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 2
    return message


def test_a_revision_the_cache_lacks_names_the_cached_ones(hub_cache: Path) -> None:
    message = problem(DataSpec(source=REPO, hub_revision="v2"))
    assert message.startswith("data.hub_revision: revision 'v2'")
    assert f"cached revisions: '{PARQUET_REVISION}'" in message
    assert f"hf download --repo-type dataset {REPO} --revision v2" in message
    assert "revision 'main'" in problem(DataSpec(source=REPO))  # the default branch, not cached
    assert OTHER_COMMIT in problem(DataSpec(source=REPO, hub_revision=OTHER_COMMIT))


def test_a_dataset_not_in_any_cache_is_one_line(hub_cache: Path, tmp_path: Path) -> None:
    import datasets

    # datasets' own offline cache is empty here too (its fallback for a dataset loaded before)
    original = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = tmp_path / "datasets-cache"
    try:
        message = problem(DataSpec(source="nobody/nothing"))
    finally:
        datasets.config.HF_DATASETS_CACHE = original
    assert message.startswith("data.source: hub dataset 'nobody/nothing'")
    assert "not in the Hugging Face cache and HF_HUB_OFFLINE=1" in message


def test_a_missing_text_field_is_one_line(hub_cache: Path) -> None:
    message = problem(DataSpec(source=REPO, hub_revision=PARQUET_REVISION, text_field="content"))
    assert (
        message
        == f"data.text_field: hub dataset {REPO!r} has no column 'content'; its columns are text"
    )


def test_a_loading_script_names_the_parquet_revision(hub_cache: Path, tmp_path: Path) -> None:
    """datasets' own refusal (a script beside the data, read by datasets 5) and a cached
    repository holding a script both name the revision that has none."""
    import datasets

    scripted = tmp_path / "scripted"
    scripted.mkdir()
    (scripted / "scripted.py").write_text("import datasets\n")
    with pytest.raises(RuntimeError) as refused:
        datasets.load_dataset(str(scripted))
    message = load_problem(DataSpec(source="Skylion007/openwebtext"), refused.value)
    assert message.startswith("data.hub_revision: hub dataset 'Skylion007/openwebtext' ships a")
    assert f'set hub_revision = "{PARQUET_REVISION}"' in message
    assert f"datasets {datasets.__version__} no longer runs" in message

    from huggingface_hub import constants

    repository = tmp_path / "repository"  # what the hub holds: the script named after the repo
    repository.mkdir()
    (repository / "webtext.py").write_text("import datasets\n")
    cache_files(Path(constants.HF_HUB_CACHE), REPO, repository, OTHER_COMMIT, "main")
    assert f'set hub_revision = "{PARQUET_REVISION}"' in problem(DataSpec(source=REPO))


def test_a_partial_conversion_is_refused(hub_cache: Path) -> None:
    """The hub converts only the first files of a very large split, into partial-<split>/, which
    datasets' split rules would read as the whole split."""
    files = hub_cache / "partial"
    write_parquet(files / "plain_text" / "partial-train" / "0000.parquet", texts(10))
    from huggingface_hub import constants

    cache_files(Path(constants.HF_HUB_CACHE), "big/corpus", files, COMMIT, PARQUET_REVISION)
    message = problem(DataSpec(source="big/corpus", hub_revision=PARQUET_REVISION))
    assert "holds only part of split 'train' (plain_text/partial-train/" in message
