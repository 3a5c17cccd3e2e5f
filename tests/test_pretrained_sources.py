"""A pretrained reference as researchers have it: a local directory, a .gguf file, or a Hugging Face
hub id pinned to a commit and read through the Hugging Face cache (offline once cached); loaded in
float32, bfloat16 or float16."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import hf_models
import numpy as np
import pytest
import tomlkit
from click.testing import CliRunner

from geospec.cli import cli
from geospec.errors import UsageError
from geospec.hub import Source, locate
from geospec.pipeline.stages.reference import Reference
from geospec.spec.loading import load_spec
from geospec.testing import minimal_spec

REPO = "tiny-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_a_local_directory_a_gguf_file_or_a_pinned_hub_id(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "m.gguf").write_bytes(b"GGUF")
    assert locate("model", None, tmp_path, "reference.checkpoint") == Source(
        str(tmp_path / "model"), "reference.checkpoint"
    )
    gguf = locate("model/m.gguf", None, tmp_path, "reference.checkpoint")
    assert gguf.from_pretrained_args() == (
        str(tmp_path / "model"),
        {"local_files_only": True, "gguf_file": "m.gguf"},
    )
    hub = locate(REPO, COMMIT, tmp_path, "data.tokenizer.path")
    assert hub.from_pretrained_args() == (REPO, {"revision": COMMIT})
    assert str(hub) == f"{REPO} at commit {COMMIT}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (REPO, 'reference.revision: .* pin its commit: reference.revision = "<40-hex commit id>"'),
        ("no/such/dir", "reference.checkpoint: .*no/such/dir does not exist"),
        ("model/config.json", "reference.checkpoint: .* is a file but not a .gguf file"),
    ],
)
def test_what_is_not_a_source_is_one_line_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(UsageError, match=message):
        locate(text, None, tmp_path, "reference.checkpoint")


@pytest.mark.parametrize(
    ("reference", "field", "message"),
    [
        ({"checkpoint": REPO, "revision": "main"}, "reference.revision", "'main' is not a commit"),
        ({"checkpoint": "./dir", "revision": COMMIT}, "reference.revision", "is not a hub id"),
        ({"revision": COMMIT}, "reference.revision", "checkpoint names none"),
        ({"dtype": "bfloat16"}, "reference.dtype", "applies to a pretrained checkpoint"),
        ({"checkpoint": "d", "dtype": "float64"}, "reference.dtype", "bfloat16"),
    ],
)
def test_spec_errors_name_the_field(
    tmp_path: Path, reference: dict[str, str], field: str, message: str
) -> None:
    spec = minimal_spec(reference=reference)
    spec["data"]["tokenizer"] = {"kind": "pretrained", "path": "d"}
    (tmp_path / "s.toml").write_text(tomlkit.dumps(spec))
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "s.toml")])
    assert result.exit_code == 2
    assert field in result.output and message in result.output, result.output


def test_the_tokenizer_is_pinned_to_the_reference_commit(tmp_path: Path) -> None:
    spec = minimal_spec(reference={"checkpoint": REPO, "revision": COMMIT})
    spec["data"]["tokenizer"] = {"kind": "pretrained", "path": REPO}
    (tmp_path / "s.toml").write_text(tomlkit.dumps(spec))
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "s.toml")])
    assert result.exit_code == 2 and "data.tokenizer.revision" in result.output
    spec["data"]["tokenizer"]["revision"] = COMMIT
    (tmp_path / "s.toml").write_text(tomlkit.dumps(spec))
    assert CliRunner().invoke(cli, ["validate", str(tmp_path / "s.toml")]).exit_code == 0


def reference_key(tmp_path: Path, **reference: str) -> str:
    spec = minimal_spec(reference=reference)
    spec["data"]["tokenizer"] = {"kind": "pretrained", "path": reference["checkpoint"]}
    if "revision" in reference:
        spec["data"]["tokenizer"]["revision"] = reference["revision"]
    (tmp_path / "s.toml").write_text(tomlkit.dumps(spec))
    return Reference.from_spec(load_spec(tmp_path / "s.toml")).key(tmp_path)


def test_keys_record_the_commit_and_the_dtype(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    at_commit = reference_key(tmp_path, checkpoint=REPO, revision=COMMIT)
    assert at_commit != reference_key(tmp_path, checkpoint=REPO, revision="f" * 40)
    local = reference_key(tmp_path, checkpoint="model")
    assert local == reference_key(
        tmp_path, checkpoint="model", dtype="float32"
    )  # default: as before
    assert local != reference_key(tmp_path, checkpoint="model", dtype="bfloat16")


# ---- a tiny Llama with its tokenizer, on disk and in a Hugging Face cache ----


def save_model(directory: Path) -> None:
    """A tiny random Llama and a word-level tokenizer (words w0..w94) in one directory."""
    hf_models.save_with_words(hf_models.llama(), directory)


def cache_as_hub_model(files: Path, cache: Path, repo_id: str, commit: str) -> None:
    """``files`` as commit ``commit`` of ``repo_id`` in the Hugging Face cache layout:
    models--org--name/blobs/<content hash>, snapshots/<commit>/<file> linked to its blob,
    refs/main holding the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    for file in sorted(files.iterdir()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / file.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def probe_spec(directory: Path, name: str, checkpoint: str, **reference: str) -> Path:
    spec = minimal_spec(
        out=str(directory / name),
        data={"files": ["docs.jsonl"], "tokenizer": {"kind": "pretrained", "path": checkpoint}},
        reference={"checkpoint": checkpoint, **reference},
        probe={"tokens": 64},
        measure=[{"geometry": "raw", "statistic": "shift"}],
        probe_only=True,
    )
    # The checkpoint's shape fills [model]: only the spec's own choices stay
    spec["model"] = {key: spec["model"][key] for key in ("seq_len", "multiple_of")}
    if "revision" in reference:
        spec["data"]["tokenizer"]["revision"] = reference["revision"]
    path = directory / f"{name}.toml"
    path.write_text(tomlkit.dumps(spec))
    return path


def clouds(run_dir: Path) -> list[np.ndarray]:
    from safetensors.numpy import load_file

    layers = sorted((run_dir / "clouds").glob("layer-*.safetensors"))
    return [np.concatenate(list(load_file(str(p)).values())) for p in layers]


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with the model files (model/), the same files cached as REPO at COMMIT
    (cache/), and a text of the tokenizer's words (docs.jsonl)."""
    from huggingface_hub import scan_cache_dir

    directory = tmp_path_factory.mktemp("hub")
    save_model(directory / "model")
    cache_as_hub_model(directory / "model", directory / "cache", REPO, COMMIT)
    # huggingface_hub's own cache reader sees the repository, its commit and every file
    (repo,) = scan_cache_dir(directory / "cache").repos
    assert (repo.repo_id, [r.commit_hash for r in repo.revisions]) == (REPO, [COMMIT])
    assert repo.nb_files == len(list((directory / "model").iterdir()))
    rng = np.random.default_rng(0)
    lines = [json.dumps({"text": " ".join(f"w{j}" for j in rng.integers(0, 95, 60))})]
    (directory / "docs.jsonl").write_text("\n".join(lines * 200))
    return directory


def probe(spec: Path) -> list[np.ndarray]:
    """`geospec run SPEC --until probe` in this process; the clouds it wrote."""
    result = CliRunner().invoke(cli, ["run", str(spec), "--until", "probe"])
    assert result.exit_code == 0, result.output
    return clouds(Path(load_spec(spec).out))


@pytest.fixture
def offline_cache(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HUB_CACHE=<hub_cache>/cache and HF_HUB_OFFLINE=1 for this process: huggingface_hub reads
    both once, at import, so they are set on its constants here (the slow test below sets the
    environment variables of a fresh process)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


@pytest.mark.torch
def test_a_hub_id_at_its_commit_is_probed_from_the_offline_cache(offline_cache: Path) -> None:
    """The hub id at its commit is probed exactly as the same files in a local directory."""
    result = CliRunner().invoke(
        cli,
        ["run", str(probe_spec(offline_cache, "hub", REPO, revision=COMMIT)), "--until", "probe"],
    )
    assert result.exit_code == 0, result.output
    assert f"pretrained checkpoint {REPO} at commit {COMMIT}" in result.output
    from_hub = clouds(offline_cache / "hub")
    assert len(from_hub) == 3  # the checkpoint's layers
    from_disk = probe(probe_spec(offline_cache, "local", str(offline_cache / "model")))
    for a, b in zip(from_hub, from_disk, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
@pytest.mark.torch
def test_hf_hub_cache_and_offline_mode_from_the_environment(hub_cache: Path) -> None:
    """`geospec run` in a fresh process with HF_HUB_CACHE at the cache and HF_HUB_OFFLINE=1, as a
    user runs it, probes the hub id exactly as the local directory."""
    spec = probe_spec(hub_cache, "hub-env", REPO, revision=COMMIT)
    environment = {**os.environ, "HF_HUB_CACHE": str(hub_cache / "cache"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "geospec", "run", str(spec), "--until", "probe"]
    finished = subprocess.run(command, env=environment, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"pretrained checkpoint {REPO} at commit {COMMIT}" in finished.stderr  # stage lines
    from_disk = probe(probe_spec(hub_cache, "local", str(hub_cache / "model")))
    for a, b in zip(clouds(hub_cache / "hub-env"), from_disk, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.torch
def test_a_commit_missing_from_the_cache_is_one_line(offline_cache: Path) -> None:
    """Offline, a commit the cache does not hold is refused by the reference stage, before
    anything is loaded, naming the field and the commits the cache has."""
    wrong = probe_spec(offline_cache, "wrong", REPO, revision="f" * 40)
    result = CliRunner().invoke(cli, ["run", str(wrong), "--until", "probe"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    # said when the spec is read: [model] is filled from the checkpoint's config.json
    assert len(lines) == 1 and lines[0].startswith(
        f"error: {wrong}: reference.revision: commit ffff"
    )
    assert f"cached commits: {COMMIT}" in lines[0] and "HF_HUB_OFFLINE=1" in lines[0]


def test_the_tokenizer_of_a_hub_id_is_read_from_the_cache(offline_cache: Path) -> None:
    from geospec.engine.tokenizer import build_tokenizer
    from geospec.spec.sections import PretrainedTokenizer

    pinned = PretrainedTokenizer(path=REPO, revision=COMMIT)
    from_hub, eos = build_tokenizer(pinned, [], offline_cache)
    from_disk, _ = build_tokenizer(PretrainedTokenizer(path="model"), [], offline_cache)
    text = "w3 w14 w15 w92 w65"
    assert from_hub.encode(text).ids == from_disk.encode(text).ids == [5, 16, 17, 94, 67]
    assert eos == 1
    missing = PretrainedTokenizer(path=REPO, revision="e" * 40)
    with pytest.raises(UsageError, match=f"data.tokenizer.revision: commit e{{40}} of {REPO}"):
        build_tokenizer(missing, [], offline_cache)


def test_validate_notes_a_hub_commit_the_cache_does_not_hold(tmp_path: Path) -> None:
    """With [model] given in full nothing needs the hub model before the run: a commit missing
    from the Hugging Face cache is a note (once, though the tokenizer reads the same commit), not
    an error. `geospec validate` in a fresh process, as a user runs it, with an empty
    HF_HUB_CACHE and HF_HUB_OFFLINE=1: exit 0, the note, no torch or numpy; once the commit is in
    the cache, no note."""
    spec = minimal_spec(reference={"checkpoint": REPO, "revision": COMMIT})
    spec["data"]["tokenizer"] = {"kind": "pretrained", "path": REPO, "revision": COMMIT}
    path = tmp_path / "spec.toml"
    path.write_text(tomlkit.dumps(spec))
    cache = tmp_path / "cache"
    script = (
        "import sys\n"
        "from geospec.cli import main\n"
        f"sys.argv = ['geospec', 'validate', {str(path)!r}]\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy'})\n"
        "assert not heavy, heavy\n"
    )
    environment = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}

    def notes() -> list[str]:
        command = [sys.executable, "-c", script]
        done = subprocess.run(command, env=environment, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{path} is valid" in done.stdout
        return [line for line in done.stdout.splitlines() if line.startswith("note: ")]

    assert notes() == [
        f"note: reference.revision: commit {COMMIT} of {REPO} is not in the Hugging Face cache "
        f"({cache}); the run downloads it when it reads it; HF_HUB_OFFLINE=1 is set, so "
        f"download it first: hf download {REPO} --revision {COMMIT}"
    ]
    files = tmp_path / "files"
    files.mkdir()
    config = {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 32}
    config |= {"num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 512}
    (files / "config.json").write_text(json.dumps(config))
    cache_as_hub_model(files, cache, REPO, COMMIT)
    assert notes() == []


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_checkpoint_loads_straight_into_its_dtype(hub_cache: Path, dtype: str) -> None:
    import torch

    from geospec.engine.pretrained import load_pretrained

    model = load_pretrained(hub_cache / "model", dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {getattr(torch, dtype)}


@pytest.mark.torch
def test_a_bfloat16_probe_is_close_to_float32_and_keyed_apart(hub_cache: Path) -> None:
    """Clouds probed in bfloat16 are stored in float32 and differ from the float32 ones by
    bfloat16's rounding (8 bits of mantissa), no more."""
    spec = probe_spec(hub_cache, "bf16", str(hub_cache / "model"), dtype="bfloat16")
    result = CliRunner().invoke(cli, ["run", str(spec), "--until", "probe"])
    assert result.exit_code == 0, result.output
    assert "in bfloat16" in result.output
    single_precision = probe(probe_spec(hub_cache, "local", str(hub_cache / "model")))
    for half, single in zip(clouds(hub_cache / "bf16"), single_precision, strict=True):
        assert half.dtype == np.float32
        relative = np.linalg.norm(half - single) / np.linalg.norm(single)
        assert 0 < relative < 2e-2


def test_a_gguf_only_directory_points_at_the_file(tmp_path: Path) -> None:
    """A directory holding just a GGUF file has no tokenizer files: the message names the file."""
    from geospec.engine.tokenizer import pretrained_tokenizer

    (tmp_path / "SmolLM2.Q4_1.gguf").write_bytes(b"GGUF")
    with pytest.raises(UsageError, match=f'path = "{tmp_path / "SmolLM2.Q4_1.gguf"}"'):
        pretrained_tokenizer(tmp_path)
