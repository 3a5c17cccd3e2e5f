"""Where a pretrained model or tokenizer is read from: a local directory, a ``.gguf`` file, or a
Hugging Face hub id at a pinned commit.

A hub model is read through the Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME``): downloaded
once, then read from the cache, so ``HF_HUB_OFFLINE=1`` works once the files are there. Only a
commit id pins a hub model (branches and tags move), so the spec requires one
(:func:`geospec.spec.sections.pinned_revision_problem`) and keys record it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geospec.errors import UsageError

#: A Hugging Face hub id ("owner/name"): what a spec's checkpoint or tokenizer path is read as
#: when it names no local file.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class Source:
    """What transformers' ``from_pretrained`` reads, and the spec fields that named it."""

    location: str
    """A local directory (a ``.gguf`` file's folder) or a hub id."""
    field: str
    """The spec field naming it, for messages ('reference.checkpoint', 'data.tokenizer.path')."""
    revision: str | None = None
    """The commit of a hub id; None for local files."""
    gguf_file: str | None = None
    """The ``.gguf`` file inside ``location``."""

    @property
    def revision_field(self) -> str:
        return self.field.rsplit(".", 1)[0] + ".revision"

    @property
    def on_hub(self) -> bool:
        return self.revision is not None

    @property
    def path(self) -> Path:
        """The local file or directory (not for hub ids)."""
        return Path(self.location) / self.gguf_file if self.gguf_file else Path(self.location)

    def __str__(self) -> str:
        return f"{self.location} at commit {self.revision}" if self.on_hub else str(self.path)

    def from_pretrained_args(self) -> tuple[str, dict[str, Any]]:
        """The first argument and keywords of ``from_pretrained`` that read this source: local
        files only, or the hub id at its commit (downloaded into the cache unless offline)."""
        if self.on_hub:
            return self.location, {"revision": self.revision}
        keywords: dict[str, Any] = {"local_files_only": True}
        if self.gguf_file:
            keywords["gguf_file"] = self.gguf_file
        return self.location, keywords


def spec_path(text: str, spec_dir: Path) -> Path:
    """A local path a spec gives: ``~`` expanded, a relative one taken from the spec file's
    directory (docs/pipeline.md, "Where relative paths start")."""
    path = Path(text).expanduser()
    return path if path.is_absolute() else spec_dir / path


def locate(text: str, revision: str | None, spec_dir: Path, field: str) -> Source:
    """The source a spec field names. With a revision it is a hub id (the spec checked its form);
    otherwise a local directory or ``.gguf`` file, relative to the spec file like every path in a
    spec. A missing path that reads as a hub id asks for the revision that would pin it."""
    if revision is not None:
        return Source(text, field, revision=revision)
    path = spec_path(text, spec_dir)
    if path.is_dir():
        return Source(str(path), field)
    if path.is_file() and path.suffix == ".gguf":
        return Source(str(path.parent), field, gguf_file=path.name)
    revision_field = field.rsplit(".", 1)[0] + ".revision"
    if path.is_file():
        raise UsageError(
            f"{field}: {path} is a file but not a .gguf file; give the model's directory or its "
            ".gguf file"
        )
    if HUB_ID.match(text) and not text.endswith(".gguf"):
        raise UsageError(
            f"{revision_field}: {text!r} is no local path; to read the Hugging Face hub model "
            f'{text}, pin its commit: {revision_field} = "<40-hex commit id>" (branches and tags '
            "move, so geospec needs the commit to reproduce what it probed)"
        )
    raise UsageError(
        f"{field}: {path} does not exist; give a local Hugging Face model directory, a .gguf "
        "file, or a hub id with revision (relative paths are relative to the spec file)"
    )


def check_hub_files(source: Source, filename: str) -> str:
    """Fetches (or finds in the cache) ``filename`` of a hub source at its commit, so a wrong id or
    commit, or a commit missing from the cache when offline, is one line naming the field; the
    file's path in the cache."""
    from huggingface_hub import constants, errors, hf_hub_download

    assert source.revision is not None
    # LocalEntryNotFoundError (offline, not cached) is a kind of EntryNotFoundError: caught first
    try:
        path: str = hf_hub_download(source.location, filename, revision=source.revision)
    except errors.LocalEntryNotFoundError:
        cached = cached_commits(source.location)
        raise UsageError(
            f"{source.revision_field}: commit {source.revision} of {source.location} is not in "
            f"the Hugging Face cache ({constants.HF_HUB_CACHE}) and it cannot be downloaded "
            + ("(HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else "(no connection)")
            + "; "
            + (
                f"cached commits: {', '.join(cached)}"
                if cached
                else f"the cache holds no commit of {source.location}"
            )
        ) from None
    except errors.RevisionNotFoundError:
        raise UsageError(
            f"{source.revision_field}: the hub model {source.location} has no commit "
            f"{source.revision}"
        ) from None
    except errors.RepositoryNotFoundError:
        raise UsageError(
            f"{source.field}: no hub model {source.location!r} (or it is private: log in with "
            "`hf auth login`)"
        ) from None
    except errors.EntryNotFoundError:
        raise UsageError(
            f"{source.field}: {source} has no {filename}; is it a transformers model?"
        ) from None
    except (OSError, errors.HfHubHTTPError) as error:
        text = " ".join(str(error).split())
        raise UsageError(
            f"{source.field}: cannot read {filename} of {source}: {text[:300]}"
        ) from None
    return path


def uncached_note(source: Source) -> str | None:
    """What ``geospec validate`` says (a note, not an error) of a hub source whose commit the
    Hugging Face cache does not hold: the run downloads it when it reads it, which offline fails.
    None for a local source or a cached commit."""
    from huggingface_hub import constants

    if not source.on_hub or source.revision in cached_commits(source.location):
        return None
    offline = (
        f"; HF_HUB_OFFLINE=1 is set, so download it first: hf download {source.location} "
        f"--revision {source.revision}"
        if constants.HF_HUB_OFFLINE
        else ""
    )
    return (
        f"{source.revision_field}: commit {source.revision} of {source.location} is not in the "
        f"Hugging Face cache ({constants.HF_HUB_CACHE}); the run downloads it when it reads it"
        + offline
    )


def cached_commits(repo_id: str) -> list[str]:
    """The commits of a hub model that the Hugging Face cache holds."""
    from huggingface_hub import CacheNotFound, constants, scan_cache_dir

    try:
        cache = scan_cache_dir(constants.HF_HUB_CACHE)
    except (CacheNotFound, OSError):
        return []
    return sorted(
        revision.commit_hash
        for repo in cache.repos
        if repo.repo_id == repo_id and repo.repo_type == "model"
        for revision in repo.revisions
    )
