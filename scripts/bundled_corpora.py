"""The two bundled corpora made from Python (issue 56): code and modern English prose, written
deterministically to geospec/data beside Austen and Shakespeare.

    python scripts/bundled_corpora.py            # writes the two .txt.gz files and the manifest
    python scripts/bundled_corpora.py --check    # the committed files against their manifest

- ``python-code.txt.gz``: the modules of some of CPython's standard-library packages (asyncio,
  email, json, ... :data:`PACKAGES`; no test modules, none over :data:`MAX_MODULE_BYTES`), read
  from the running interpreter's ``sysconfig`` stdlib, in path order, each module a document
  that starts with the comment line ``# Lib/<path>``. Packages only: the top-level modules are
  specs/corpora's (scripts/code_corpus.py: the Qwen studies' calibration and eval text), and
  pydoc_data (the language reference's text, specs/corpora/python-reference.txt.gz) is left out.
- ``python-docs.txt.gz``: the prose of Python's documentation: the tutorial, the HOWTOs, the
  FAQs, the What's New essays, and the guides to using, extending, installing and distributing
  Python (:data:`DOC_PARTS`), from the HTML Debian's ``python3.11-doc`` package installs
  (``apt-get install python3.11-doc``). Code examples (``<pre>`` blocks) are dropped, so this is
  prose; every page is a document starting ``# <its title>``, its other headings ``## ``, its
  paragraphs, list items and table cells one block each, separated by blank lines. The language
  and library references are left out (the eval corpus python-reference.txt.gz is made of them).

Licence: CPython's source and its documentation are distributed under the Python Software
Foundation License Version 2 (PSF-2.0), which permits copying and redistribution provided the
licence and PSF's copyright notice are retained: geospec/data/LICENSE-PSF.txt is the licence as
the interpreter ships it, and geospec/data/corpora.md says what each bundled corpus is and under
which terms. Both files are gzip-compressed with no name and no timestamp, so the same
interpreter and documentation package give the same bytes; the manifest (bundled-corpora.json)
records both versions, every module and page, and each file's SHA-256. The committed files were
built from CPython 3.11.7 and python3.11-doc 3.11.2-6+deb12u9.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html.parser
import json
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "geospec" / "data"
MANIFEST = "bundled-corpora.json"
CODE, DOCS = "python-code.txt.gz", "python-docs.txt.gz"
#: The standard library's packages whose modules make the code corpus.
PACKAGES = (
    "asyncio", "collections", "concurrent", "email", "html", "http", "importlib", "json",
    "logging", "multiprocessing", "re", "sqlite3", "tomllib", "unittest", "urllib", "wsgiref",
    "xml", "xmlrpc", "zoneinfo",
)  # fmt: skip
#: A module larger than this is left out, so that none dominates (html.entities' tables).
MAX_MODULE_BYTES = 60_000
DOCS_PACKAGE = "python3.11-doc"
DOCS_HTML = Path("/usr/share/doc/python3.11/html")
#: The documentation's folders of prose (not the language or library reference).
DOC_PARTS = (
    "tutorial", "howto", "faq", "whatsnew", "using", "extending", "installing", "distributing",
)  # fmt: skip
#: Elements whose end closes a block of text.
BLOCKS = {"p", "li", "dt", "dd", "td", "th", "div", "section", "blockquote", "table", "tr",
          "ul", "ol", "dl", "caption"} | {f"h{level}" for level in range(1, 7)}  # fmt: skip
VOID = {"br", "img", "hr", "meta", "link", "input", "col", "area", "base", "wbr", "source"}


def code_modules(stdlib: Path) -> list[Path]:
    """The modules of :data:`PACKAGES`: no test module, none over :data:`MAX_MODULE_BYTES`."""
    found = []
    for package in PACKAGES:
        for path in (stdlib / package).rglob("*.py"):
            parts = path.relative_to(stdlib).parts
            if any(p.startswith("test") or p == "__pycache__" for p in parts):
                continue
            if path.stat().st_size <= MAX_MODULE_BYTES:
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(stdlib).as_posix())


def code_documents(stdlib: Path) -> dict[str, str]:
    """Each module's source (universal newlines) under its ``# Lib/<path>`` line, by path."""
    documents = {}
    for path in code_modules(stdlib):
        name = f"Lib/{path.relative_to(stdlib).as_posix()}"
        documents[name] = f"# {name}\n{path.read_text(encoding='utf-8').strip()}\n"
    return documents


class PageText(html.parser.HTMLParser):
    """The text of a Sphinx page's main body: one block per paragraph, list item, table cell or
    heading (headings marked ``#`` by level), without code, permalinks or scripts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, bool]] = []  # the elements open inside the body
        self.inside = False
        self.skipping = 0
        self.blocks: list[str] = []
        self.pending: list[str] = []
        self.heading = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if not self.inside:
            self.inside = tag == "div" and attributes.get("role") == "main"
            return
        if tag in VOID:
            return
        classes = attributes.get("class") or ""
        skip = tag in ("pre", "script", "style") or "headerlink" in classes
        skip = skip or "highlight" in classes
        self.open.append((tag, skip))
        self.skipping += skip
        if tag in BLOCKS:
            self.close_block()
        if tag[0] == "h" and tag[1:].isdigit():
            self.heading = int(tag[1:])

    def handle_endtag(self, tag: str) -> None:
        if not self.inside or tag in VOID:
            return
        if not self.open:  # the main body's own </div>
            self.close_block()
            self.inside = False
            return
        while self.open:  # an element left open (HTML allows it) closes with its parent
            name, skip = self.open.pop()
            self.skipping -= skip
            if name == tag:
                break
        if tag in BLOCKS:
            self.close_block()

    def handle_data(self, data: str) -> None:
        if self.inside and not self.skipping:
            self.pending.append(data)

    def close_block(self) -> None:
        text = " ".join("".join(self.pending).split())
        self.pending = []
        if text:
            self.blocks.append(f"{'#' * self.heading} {text}" if self.heading else text)
        self.heading = 0


def page_text(path: Path) -> str:
    """One documentation page as a document: its title's line ``# ...`` first."""
    parser = PageText()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    blocks = parser.blocks
    if not blocks or not blocks[0].startswith("# "):
        raise ValueError(f"{path}: no title (h1) opens the page")
    # a block that would read as another page's title is a deeper heading
    body = [f"#{b}" if b.startswith("# ") else b for b in blocks[1:]]
    return "\n\n".join([blocks[0], *body]) + "\n"


def docs_documents(root: Path) -> dict[str, str]:
    """Each prose page (no part's index page) as a document, by path."""
    pages = sorted(
        path.relative_to(root).as_posix()
        for part in DOC_PARTS
        for path in (root / part).rglob("*.html")
        if path.name != "index.html"
    )
    return {page: page_text(root / page) for page in pages}


def docs_version() -> str:
    """The installed documentation package's version, or exit 2 saying how to install it."""
    dpkg = shutil.which("dpkg-query")
    result = (
        subprocess.run([dpkg, "-W", "-f=${Version}", DOCS_PACKAGE], capture_output=True, text=True)
        if dpkg
        else None
    )
    if result is None or result.returncode != 0 or not DOCS_HTML.is_dir():
        sys.exit(f"{DOCS_HTML} not found: apt-get install {DOCS_PACKAGE} (a Debian package)")
    return result.stdout.strip()


def compressed(documents: dict[str, str]) -> bytes:
    """The documents one after the other (each ends with a newline; a blank line between two),
    gzip-compressed with no file name and no timestamp."""
    text = "\n".join(documents.values())
    return gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)


def build(out: Path) -> dict[str, object]:
    """Write the two corpora and the manifest into ``out``; the manifest."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = {
        CODE: (code_documents(stdlib), f"CPython {platform.python_version()} standard library"),
        DOCS: (docs_documents(DOCS_HTML), f"{DOCS_PACKAGE} {docs_version()} (Debian)"),
    }
    manifest: dict[str, object] = {"licence": "PSF-2.0 (geospec/data/LICENSE-PSF.txt)"}
    for name, (documents, source) in sources.items():
        data = compressed(documents)
        (out / name).write_bytes(data)
        manifest[name] = {
            "source": source,
            "sha256": hashlib.sha256(data).hexdigest(),
            "characters": sum(len(text) for text in documents.values()),
            "documents": list(documents),
        }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check(out: Path) -> list[str]:
    """What is wrong with the committed files against their manifest (empty: nothing)."""
    manifest = json.loads((out / MANIFEST).read_text())
    problems = []
    for name in (CODE, DOCS):
        data = (out / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != manifest[name]["sha256"]:
            problems.append(f"{out / name}: not the bytes the manifest records")
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
    for name in (CODE, DOCS):
        entry = manifest[name]
        assert isinstance(entry, dict)
        size = (args.out / name).stat().st_size
        print(f"{name}: {len(entry['documents'])} documents, {entry['characters']:,} characters, "
              f"{size:,} bytes compressed ({entry['source']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
