"""A full disk, on a real full file system (a small tmpfs; mounting one needs root, so the tests
skip with the reason where it is refused): one line naming the directory, the file and the free
space, exit 2, no traceback, nothing partial under a final name, and a rerun once there is space
that ends exactly where an uninterrupted run does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from small_spec import small_spec

from geospec.errors import OutOfSpace
from geospec.pipeline.run_dir import record_failure
from geospec.rundir.layout import FAILURE_FILE
from geospec.storage.atomic import atomic_path, atomic_write_json


class Tmpfs:
    """A tmpfs mounted on a directory, its size changeable while mounted (contents kept)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mount(self, size: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.path)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")

    def resize(self, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    mounted = Tmpfs(tmp_path / "small")
    try:
        yield mounted
    finally:
        mounted.unmount()


def fill(directory: Path) -> None:
    """Fill the file system of ``directory`` to its last byte."""
    try:
        with open(directory / "filler", "wb", buffering=0) as handle:
            while True:
                handle.write(b"\0" * 4096)
    except OSError:
        pass
    try:
        with open(directory / "filler", "ab", buffering=0) as handle:
            while True:
                handle.write(b"\0")  # the last bytes of the last page
    except OSError:
        pass


def test_an_atomic_write_on_a_full_disk_is_one_error_and_leaves_nothing(tmpfs: Tmpfs) -> None:
    import torch
    from safetensors.torch import save_file

    tmpfs.mount("256k")
    fill(tmpfs.path)
    with pytest.raises(OutOfSpace, match=r"writing stages.json \(0 B free\)"):
        atomic_write_json(tmpfs.path / "stages.json", {"a": "b" * 8192})
    assert not (tmpfs.path / "stages.json").exists()
    (tmpfs.path / "filler").unlink()
    tensors = {"w": torch.zeros(1 << 17)}  # 512 KiB: more than the file system holds
    writers = {
        "state.pt": lambda tmp: torch.save(tensors, tmp),  # says nothing about space
        "model.safetensors": lambda tmp: save_file(tensors, str(tmp)),
        "big.json": lambda tmp: tmp.write_text("0" * (1 << 19)),
    }
    for name, write in writers.items():
        with pytest.raises(OutOfSpace) as caught, atomic_path(tmpfs.path / name) as tmp:
            write(tmp)
        message = str(caught.value)
        assert f"in {tmpfs.path} writing {name} (" in message and " free)" in message
        assert "\n" not in message
        assert list(tmpfs.path.iterdir()) == []  # no partial file, no temporary one


def test_recording_a_failure_on_a_full_disk_never_raises(
    tmpfs: Tmpfs, capsys: pytest.CaptureFixture[str]
) -> None:
    tmpfs.mount("64k")
    fill(tmpfs.path)
    record_failure(tmpfs.path / "run", RuntimeError("the run's own error"))
    assert not (tmpfs.path / "run" / FAILURE_FILE).exists()
    assert "could not record the failure" in capsys.readouterr().err


def test_a_full_disk_no_writer_named_is_still_one_line_from_the_cli(tmp_path: Path) -> None:
    """An ENOSPC raised outside geospec's writers (a library's own file) reaches the CLI as one
    line naming the file the OS error names; any other OSError keeps its traceback (a bug)."""
    import errno

    import click
    from click.testing import CliRunner

    from geospec.cli import COMMANDS, cli

    @click.command()
    @click.argument("code", type=int)
    def write(code: int) -> None:
        raise OSError(code, os.strerror(code), str(tmp_path / "lib" / "cache.bin"))

    COMMANDS["full-disk-test"] = f"{__name__}:_command"
    globals()["_command"] = write
    try:
        full = CliRunner().invoke(cli, ["full-disk-test", str(errno.ENOSPC)])
        other = CliRunner().invoke(cli, ["full-disk-test", str(errno.EACCES)])
    finally:
        del COMMANDS["full-disk-test"]
    assert full.exit_code == 2, full.output
    assert f"out of disk space in {tmp_path / 'lib'} writing cache.bin" in full.output
    assert isinstance(other.exception, PermissionError)


# ---------------------------------------------------------------------------------------------
# the quick pipeline on a full disk, then resumed with space

SPEC = {"steps": 20, "checkpoint_interval": 5}


def geospec_run(spec: Path, out: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GEOSPEC_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip
    command = [sys.executable, "-m", "geospec", "run", str(spec), "--out", str(out)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def outcome(out: Path) -> dict[str, object]:
    """What an interrupted and an uninterrupted run must agree on: the results, the widths and
    every trained model's weights, byte for byte."""
    weights = {
        str(path.relative_to(out)): path.read_bytes()
        for path in sorted(out.rglob("model.safetensors"))
    }
    return {
        "results": json.loads((out / "results.json").read_text()),
        "widths": json.loads((out / "widths.json").read_text())["arms"],
        "weights": weights,
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    directory = tmp_path_factory.mktemp("straight")
    spec = directory / "spec.toml"
    spec.write_text(small_spec("space", SPEC))
    done = geospec_run(spec, directory / "run", directory / "cache")
    assert done.returncode == 0, done.stderr
    return outcome(directory / "run")


def check_one_line(done: subprocess.CompletedProcess[str], directory: Path) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert f"out of disk space in {directory}" in errors[0], errors[0]
    assert " free); free space there" in errors[0]


def no_partial_files(root: Path) -> None:
    """Every JSON artifact under ``root`` reads; no temporary file is left."""
    for path in root.rglob("*"):
        assert not path.name.endswith(".tmp"), path
        if path.suffix == ".json" and path.is_file():
            json.loads(path.read_text())


@pytest.mark.slow  # two or three quick pipelines each: ~50 s on 2 cores
@pytest.mark.parametrize(
    ("full", "size"),
    [("out", "900k"), ("cache", "200k")],  # the finished run takes 1.8 MiB, the tokens 1.7 MiB
)
def test_a_full_disk_fails_in_one_line_and_a_rerun_with_space_resumes(
    full: str, size: str, tmpfs: Tmpfs, tmp_path: Path, uninterrupted: dict[str, object]
) -> None:
    tmpfs.mount(size)
    spec = tmp_path / "spec.toml"
    spec.write_text(small_spec("space", SPEC))
    out = tmpfs.path / "run" if full == "out" else tmp_path / "run"
    cache = tmpfs.path / "cache" if full == "cache" else tmp_path / "cache"
    done = geospec_run(spec, out, cache)
    check_one_line(done, out if full == "out" else cache / "tokens")
    no_partial_files(tmpfs.path)
    if full == "cache":  # the tokens are built under .<key>.partial, kept to resume from
        left = [p for p in (cache / "tokens").iterdir() if not p.name.endswith(".lock")]
        assert all(p.name.startswith(".") and p.name.endswith(".partial") for p in left), left
    tmpfs.resize("16m")
    again = geospec_run(spec, out, cache)
    assert again.returncode == 0, again.stderr
    assert outcome(out) == uninterrupted
