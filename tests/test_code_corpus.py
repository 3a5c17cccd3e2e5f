"""The code corpus (scripts/code_corpus.py, issue 47): Python's standard library split by module
into calibration and held-out parts. The committed files are read here with gzip and json alone
and checked against the manifest and the split rule; a tampered file is caught by the script's
own check."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
CORPORA = ROOT / "specs" / "corpora"


def rows(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return [json.loads(line) for line in file]


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "code_corpus", ROOT / "scripts" / "code_corpus.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_parts_are_disjoint_modules_split_by_their_names() -> None:
    manifest = json.loads((CORPORA / "python-stdlib.json").read_text())
    parts = {}
    for part in ("calibration", "heldout"):
        path = CORPORA / manifest[part]["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == manifest[part]["sha256"]
        found = rows(path)
        parts[part] = [row["module"] for row in found]
        assert parts[part] == sorted(parts[part]) == list(manifest[part]["modules"])
        for row in found:
            # the rule of the name alone: the first 8 hex digits of its SHA-256, divisible by 4
            held = int(hashlib.sha256(row["module"].encode()).hexdigest()[:8], 16) % 4 == 0
            assert held == (part == "heldout"), row["module"]
            assert len(row["text"].encode("utf-8")) <= 60_000
            compile(row["text"], row["module"], "exec")  # Python source, whole
    assert not set(parts["calibration"]) & set(parts["heldout"])
    assert len(parts["heldout"]) >= 25 and len(parts["calibration"]) >= 80
    assert manifest["licence"].startswith("PSF-2.0")


def test_a_tampered_part_fails_the_scripts_check(tmp_path: Path) -> None:
    code_corpus = script()
    for name in ("python-stdlib.json", "python-stdlib-calibration.jsonl.gz",
                 "python-stdlib-heldout.jsonl.gz"):  # fmt: skip
        shutil.copy(CORPORA / name, tmp_path / name)
    assert code_corpus.check(tmp_path) == []
    held = rows(tmp_path / "python-stdlib-heldout.jsonl.gz")
    held[0]["text"] += "\n# edited\n"
    lines = [json.dumps(row) for row in held]
    (tmp_path / "python-stdlib-heldout.jsonl.gz").write_bytes(code_corpus.compressed(lines))
    problems = code_corpus.check(tmp_path)
    assert any("not the bytes" in p for p in problems)
    assert any(f"module {held[0]['module']} is not the manifest's text" in p for p in problems)
