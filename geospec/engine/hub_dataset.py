"""A hub dataset's rows: through ``datasets`` online, from the Hugging Face cache offline.

Online, ``datasets.load_dataset(name, config, split=..., revision=...)`` reads the dataset (and
caches its files). datasets 4 and later refuse a repository that still ships a loading script
("Dataset scripts are no longer supported"); the hub's parquet conversion of it, the revision
``refs/convert/parquet``, has no script, and geospec's message names it.

Offline (``HF_HUB_OFFLINE=1``, as on a cluster's compute nodes) datasets does not look in the hub
cache at all, so geospec does: the files of the spec's revision, as ``hf download --repo-type
dataset NAME --revision REV`` (or an earlier online run) left them in ``HF_HUB_CACHE``, are read
with datasets' own inference of configs and splits (the README's ``configs``, else directory and
file names), streamed from the cached files (no second copy). huggingface_hub refuses a snapshot
its cached file listing shows to be incomplete. A dataset missing from the hub cache falls back to
datasets' own offline cache (a dataset loaded online before), as it always did.

Every failure is one line naming the dataset, the revision and the fix (exit status 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geospec.errors import UsageError
from geospec.spec.sections import DataSpec

#: the hub's parquet conversion of a dataset repository: what datasets >= 4 reads for a dataset
#: that ships a loading script
PARQUET_REVISION = "refs/convert/parquet"
SCRIPT_REFUSED = "Dataset scripts are no longer supported"


def load_hub_dataset(data: DataSpec) -> Any:
    """The split of the hub dataset ``data.corpus`` names (a datasets ``Dataset`` or, streamed,
    ``IterableDataset``); :class:`UsageError` when it cannot be loaded."""
    import datasets
    from huggingface_hub import is_offline_mode

    assert data.corpus is not None
    if is_offline_mode():
        snapshot = cached_snapshot(data)
        if snapshot is not None:
            try:
                return datasets.load_dataset(
                    str(snapshot), data.hub_config, split=data.hub_split, streaming=True
                )
            except Exception as error:  # datasets raises many types; all mean "cannot load this"
                raise UsageError(load_problem(data, error, snapshot)) from None
    try:
        return datasets.load_dataset(
            data.corpus,
            data.hub_config,
            split=data.hub_split,
            streaming=data.streaming,
            revision=data.hub_revision,
        )
    except Exception as error:
        raise UsageError(load_problem(data, error)) from None


def documents_in(dataset: Any, split: str) -> int | None:
    """The rows of a loaded split where datasets knows them: a downloaded split's length, or the
    size the dataset's card records; None for a streamed split of unknown size."""
    try:
        return len(dataset)
    except TypeError:
        pass
    splits = getattr(getattr(dataset, "info", None), "splits", None) or {}
    rows = getattr(splits.get(split), "num_examples", None)
    return int(rows) if rows else None


def cached_snapshot(data: DataSpec) -> Path | None:
    """The directory of the spec's revision in the hub cache; None when the hub cache holds no
    revision of the dataset at all. :class:`UsageError` when it holds others but not this one,
    or this one incomplete, or a loading script."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    assert data.corpus is not None
    name = data.corpus
    revision = data.hub_revision or "main"
    repo = Path(constants.HF_HUB_CACHE) / ("datasets--" + name.replace("/", "--"))
    if not repo.is_dir():
        return None
    try:
        snapshot = Path(
            snapshot_download(name, repo_type="dataset", revision=revision, local_files_only=True)
        )
    except IncompleteSnapshotError as error:
        raise UsageError(
            f"data.source: the cached copy of hub dataset {name!r} at revision {revision!r} is "
            f"incomplete ({_first_sentence(error)}); {_download_hint(name, revision)}"
        ) from None
    except LocalEntryNotFoundError:
        cached = ", ".join(repr(r) for r in cached_revisions(repo)) or "none"
        raise UsageError(
            f"data.hub_revision: revision {revision!r} of hub dataset {name!r} is not in the "
            f"Hugging Face cache {constants.HF_HUB_CACHE} (HF_HUB_OFFLINE=1; cached revisions: "
            f"{cached}); {_download_hint(name, revision)}"
        ) from None
    script = snapshot / (name.rsplit("/", 1)[-1] + ".py")
    if script.is_file():  # what datasets itself refuses online
        raise UsageError(load_problem(data, RuntimeError(f"{SCRIPT_REFUSED}, but found {script}")))
    partial = sorted(p for p in snapshot.rglob(f"partial-{data.hub_split}") if p.is_dir())
    if partial:  # datasets' split rules would read these files as the whole split
        raise UsageError(
            f"data.hub_revision: revision {revision!r} of hub dataset {name!r} holds only part of "
            f"split {data.hub_split!r} ({partial[0].relative_to(snapshot)}/: the hub converts the "
            "first files of a very large split); use a revision with the whole split, or list "
            "the files you mean in data.files"
        )
    return snapshot


def cached_revisions(repo: Path) -> list[str]:
    """The branch and tag names (``refs/...`` included) the cached repository records."""
    refs = repo / "refs"
    return sorted(str(p.relative_to(refs)) for p in refs.rglob("*") if p.is_file())


def load_problem(data: DataSpec, error: BaseException, snapshot: Path | None = None) -> str:
    """One line for a hub dataset that datasets could not load: the loading-script refusal names
    the parquet revision to use; being offline names the download to do."""
    import datasets

    name, revision = data.corpus, data.hub_revision
    text = str(error)
    if SCRIPT_REFUSED in text:
        if revision != PARQUET_REVISION:
            return (
                f"data.hub_revision: hub dataset {name!r} ships a loading script, which datasets "
                f"{datasets.__version__} no longer runs; set hub_revision = "
                f'"{PARQUET_REVISION}" (the hub\'s parquet conversion of it, no script)'
            )
        return (
            f"data.source: hub dataset {name!r} at revision {revision!r} still holds a loading "
            f"script, which datasets {datasets.__version__} no longer runs; use a revision with "
            "data files (parquet, json, csv or text)"
        )
    where = f"hub dataset {name!r} (config {data.hub_config!r}, split {data.hub_split!r}, "
    where += f"revision {revision!r}"
    where += f", read from the Hugging Face cache {snapshot})" if snapshot else ")"
    from huggingface_hub import is_offline_mode

    if snapshot is None and is_offline_mode():
        return (
            f"data.source: {where} is not in the Hugging Face cache and HF_HUB_OFFLINE=1; "
            f"{_download_hint(name, revision or 'main')}"
        )
    return f"data.source: cannot load {where}: {_first_sentence(error)}"


def _download_hint(name: str | None, revision: str) -> str:
    return (
        f"download it once where there is network (hf download --repo-type dataset {name} "
        f"--revision {revision}), or run without HF_HUB_OFFLINE"
    )


def _first_sentence(error: BaseException) -> str:
    """The error's first line (hub errors run on for paragraphs)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
