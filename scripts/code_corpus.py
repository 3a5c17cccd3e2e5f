"""A code corpus for a code model (issue 47): Python's standard library, split by module into a
calibration part and a held-out part, written deterministically to specs/corpora.

    python scripts/code_corpus.py            # writes the two .jsonl.gz files and the manifest
    python scripts/code_corpus.py --check    # the committed files against their manifest

The modules are the top-level ``*.py`` files of the running interpreter's standard library
(``sysconfig``'s ``stdlib``): public ones (no leading underscore) of at most 60,000 bytes, so
that no single module (``typing``, ``_pydecimal``) dominates a part. A module is held out when
the first 8 hex digits of the SHA-256 of its name, read as a number, are divisible by 4: a rule
of the name alone, so a module's part does not depend on which other modules exist. Each
module is one JSON line ``{"text": source, "module": name}``, in name order, gzip-compressed
without a timestamp: the same interpreter gives the same bytes. The manifest
(python-stdlib.json) records the Python version, the rule, every module's part and the SHA-256
of its source, and each file's SHA-256; the committed files were built from CPython 3.11.7.

Licence: CPython's standard library is distributed under the Python Software Foundation License
(PSF-2.0), which permits copying and redistribution with its notice; a few modules carry
compatible notices of their own in their source, kept in the text.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import platform
import sys
import sysconfig
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "specs" / "corpora"
STEM = "python-stdlib"
PARTS = ("calibration", "heldout")
MAX_BYTES = 60_000
RULE = "held out when int(sha256(module name)[:8], 16) % 4 == 0"


def held_out(module: str) -> bool:
    """The split rule (:data:`RULE`): a function of the module's name alone."""
    return int(hashlib.sha256(module.encode()).hexdigest()[:8], 16) % 4 == 0


def modules(stdlib: Path) -> list[Path]:
    """The standard library's public top-level modules of at most :data:`MAX_BYTES`, by name."""
    return sorted(
        path
        for path in stdlib.glob("*.py")
        if not path.name.startswith("_") and path.stat().st_size <= MAX_BYTES
    )


def compressed(lines: list[str]) -> bytes:
    """The JSON lines gzip-compressed with no file name and no timestamp (the same bytes for
    the same lines)."""
    return gzip.compress("\n".join(lines).encode("utf-8") + b"\n", mtime=0)


def build(out: Path) -> dict[str, object]:
    """Write the two parts and the manifest into ``out``; the manifest."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = modules(stdlib)
    manifest: dict[str, object] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "rule": RULE,
        "max_bytes": MAX_BYTES,
        "licence": "PSF-2.0 (CPython's standard library)",
    }
    for part in PARTS:
        chosen = [p for p in found if held_out(p.stem) == (part == "heldout")]
        texts = {p.stem: p.read_text(encoding="utf-8") for p in chosen}
        lines = [json.dumps({"text": text, "module": name}) for name, text in texts.items()]
        data = compressed(lines)
        (out / f"{STEM}-{part}.jsonl.gz").write_bytes(data)
        manifest[part] = {
            "file": f"{STEM}-{part}.jsonl.gz",
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes_of_source": sum(len(t.encode("utf-8")) for t in texts.values()),
            "modules": {
                name: hashlib.sha256(text.encode("utf-8")).hexdigest()
                for name, text in texts.items()
            },
        }
    (out / f"{STEM}.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check(out: Path) -> list[str]:
    """What is wrong with the files in ``out`` against their manifest (empty: nothing)."""
    manifest = json.loads((out / f"{STEM}.json").read_text())
    problems = []
    for part in PARTS:
        entry = manifest[part]
        path = out / entry["file"]
        if hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            problems.append(f"{path}: not the bytes the manifest records")
        with gzip.open(path, "rt", encoding="utf-8") as file:
            rows = [json.loads(line) for line in file]
        names = [row["module"] for row in rows]
        if names != list(entry["modules"]):
            problems.append(f"{path}: its modules are not the manifest's")
        for row in rows:
            digest = hashlib.sha256(row["text"].encode("utf-8")).hexdigest()
            if entry["modules"].get(row["module"]) != digest:
                problems.append(f"{path}: module {row['module']} is not the manifest's text")
            if held_out(row["module"]) != (part == "heldout"):
                problems.append(f"{path}: module {row['module']} is in the wrong part")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check the committed files")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.check:
        problems = check(args.out)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    manifest = build(args.out)
    for part in PARTS:
        entry = manifest[part]
        assert isinstance(entry, dict)
        print(f"{entry['file']}: {len(entry['modules'])} modules, {entry['bytes_of_source']:,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
