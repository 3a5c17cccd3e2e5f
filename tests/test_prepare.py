"""``geospec prepare SPEC``: the token cache built ahead of a run, resumable after a kill, never
half-written under a finished name, and found by ``geospec run``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomlkit
from click.testing import CliRunner

from geospec.cli import cli
from geospec.engine.progress import DataProgress
from geospec.engine.token_data import META_FILE, STATE_FILE, partial_dir
from geospec.spec.loading import load_spec
from geospec.spec.sections import DataSpec
from geospec.testing import minimal_spec

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def write_corpus(path: Path, documents: int) -> list[str]:
    texts = [
        f"Paragraph {i} says " + " ".join(f"w{(i * 31 + j) % 997}" for j in range(4 + i % 9))
        for i in range(documents)
    ]
    path.write_text("\n\n".join(texts) + "\n")
    return texts


def write_spec(directory: Path, documents: int, **data: object) -> Path:
    write_corpus(directory / "corpus.txt", documents)
    spec = minimal_spec(
        out=str(directory / "run"),
        data={"files": ["corpus.txt"], "tokenizer": {"kind": "gpt2"}, "val_fraction": 0.05, **data},
    )
    path = directory / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def prepare_process(spec: Path, cache: Path) -> subprocess.Popen[str]:
    environment = {**os.environ, "GEOSPEC_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "geospec", "prepare", str(spec)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def cache_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_an_interrupted_prepare_resumes_to_the_identical_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted (Ctrl-C) in its 25th batch: the partial build is kept, not renamed; prepared
    again it resumes after the 20 batches it recorded, to the bytes of an uninterrupted build."""
    from geospec.engine import token_data

    write_corpus(tmp_path / "corpus.txt", 30_000)
    data = DataSpec(files=["corpus.txt"], tokenizer={"kind": "gpt2"}, val_fraction=0.05)
    fresh = token_data.prepare_data(data, tmp_path / "fresh", spec_dir=tmp_path)
    packed = token_data.pack
    calls = {"n": 0}

    def interrupted(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2 * 25:  # a train and a validation part per batch
            raise KeyboardInterrupt
        return packed(*args)

    monkeypatch.setattr(token_data, "pack", interrupted)
    with pytest.raises(KeyboardInterrupt):
        token_data.prepare_data(data, tmp_path / "cache", spec_dir=tmp_path)
    work = token_data.partial_dir(tmp_path / "cache", fresh.key)
    assert json.loads((work / STATE_FILE).read_text())["batches"] == 20
    assert not (tmp_path / "cache" / fresh.key).exists()
    monkeypatch.setattr(token_data, "pack", packed)
    said: list[str] = []
    resumed = token_data.prepare_data(
        data, tmp_path / "cache", spec_dir=tmp_path, say=said.append, progress=True
    )
    assert said[0].startswith("tokens: resuming after")
    assert cache_files(resumed.directory) == cache_files(fresh.directory)


@pytest.mark.slow
def test_a_killed_prepare_resumes_to_the_identical_cache(tmp_path: Path) -> None:
    """SIGKILL once the build has recorded a resumable point: nothing under the finished name,
    the partial build kept; run again, it resumes (says so) and ends with the bytes of a build
    that was never interrupted."""
    spec = write_spec(tmp_path, documents=50_000)  # 50 batches, a resumable point every 10
    killed_cache = tmp_path / "killed"
    process = prepare_process(spec, killed_cache)
    deadline = time.monotonic() + 120
    state_files: list[Path] = []
    while time.monotonic() < deadline and not state_files and process.poll() is None:
        state_files = list((killed_cache / "tokens").glob(f".*.partial/{STATE_FILE}"))
        time.sleep(0.01)
    assert state_files, "the build ended before it recorded a resumable point"
    process.send_signal(signal.SIGKILL)
    process.wait()
    work = state_files[0].parent
    key = work.name.removeprefix(".").removesuffix(".partial")
    assert work == partial_dir(killed_cache / "tokens", key)
    assert not (killed_cache / "tokens" / key).exists()  # no finished-looking name
    resumed = prepare_process(spec, killed_cache)
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err
    assert "tokens: resuming after" in err
    assert not work.exists()

    fresh = prepare_process(spec, tmp_path / "fresh")
    _, err = fresh.communicate(timeout=300)
    assert fresh.returncode == 0, err
    assert "resuming" not in err
    finished = killed_cache / "tokens" / key
    assert sorted(cache_files(finished)) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]
    assert cache_files(finished) == cache_files(tmp_path / "fresh" / "tokens" / key)


def test_geospec_run_reads_the_prepared_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `geospec run` opens (RunContext.token_data) is the directory prepare built, as is."""
    from rich.console import Console

    from geospec.engine.distributed import context
    from geospec.pipeline.context import RunContext

    spec_path = write_spec(tmp_path, documents=400)
    monkeypatch.setenv("GEOSPEC_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli, ["prepare", str(spec_path)])
    assert result.exit_code == 0, result.output
    [meta] = (tmp_path / "cache" / "tokens").glob(f"*/{META_FILE}")
    assert f"{meta.parent}:" in result.output and "geospec run" in result.output
    before = {p.name: p.stat().st_mtime_ns for p in meta.parent.iterdir()}
    spec = load_spec(spec_path)
    run = RunContext(Path(spec.run_dir), tmp_path, Console(), context(), "cpu")
    data = run.token_data(spec.data)
    assert data.directory == meta.parent
    assert {p.name: p.stat().st_mtime_ns for p in meta.parent.iterdir()} == before
    # the documents of the corpus, every one followed by GPT-2's end-of-text token
    assert (data.meta["documents"]["train"] + data.meta["documents"]["val"]) == 400
    assert int((data.train == 50256).sum() + (data.val == 50256).sum()) == 400


def test_progress_names_documents_tokens_rate_eta_and_size() -> None:
    lines: list[str] = []
    progress = DataProgress(lines.append, lambda: 1000, interval=0.0)
    progress.start(0, 0, itemsize=2)
    progress.started -= 10.0  # ten seconds in
    progress.update(250, 50_000)
    # 5,000 tokens/s; 25 documents/s, 750 to go: 30 s; 200 tokens a document x 1000 x 2 bytes
    assert lines == [
        "tokens: 250/1,000 documents, 50,000 tokens, 5,000 tokens/s, eta 0m30s, "
        "about 400 KB on disk"
    ]


def test_bad_data_is_one_line_and_leaves_no_partial_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("GEOSPEC_CACHE", str(tmp_path / "cache"))
    spec = minimal_spec(out=str(tmp_path / "run"), data={"source": "nobody/nothing"})
    path = tmp_path / "hub.toml"
    path.write_text(tomlkit.dumps(spec))
    result = CliRunner().invoke(cli, ["prepare", str(path)])
    assert result.exit_code == 2, result.output
    [line] = [text for text in result.output.splitlines() if text.startswith("error:")]
    assert "hub dataset 'nobody/nothing'" in line and "HF_HUB_OFFLINE=1" in line
    # an empty split, found after tokenizing: refused, and its partial build removed
    empty = write_spec(tmp_path, documents=1, val_fraction=0.01)
    result = CliRunner().invoke(cli, ["prepare", str(empty)])
    assert result.exit_code == 2 and "the val split is empty" in result.output
    assert not list((tmp_path / "cache" / "tokens").glob(".*.partial"))
    assert not list((tmp_path / "cache" / "tokens").glob(f"*/{META_FILE}"))
