"""Checks run by `nox -s plugins` after installing the example packages (one per kind:
geospec-cka, geospec-manhattan, geospec-step, geospec-jsonl) and geospec-broken.

The real packages are installed with pip, so this exercises entry-point discovery end to end;
then each example's own tests run against the installed package (they use geospec.testing's
contract checks).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
#: Each example package and the one plugin it registers.
EXAMPLES = {
    "geospec-cka": ("statistic", "cka"),
    "geospec-manhattan": ("geometry", "manhattan"),
    "geospec-step": ("schedule", "step"),
    "geospec-jsonl": ("tracker", "jsonl"),
}


def geospec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["geospec", *args], capture_output=True, text=True)


def main() -> None:
    listed = geospec("plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    by_name = {p["name"]: p for p in data["plugins"]}
    for package, (kind, name) in EXAMPLES.items():
        assert by_name[package]["version"] == "0.1.0", by_name
        assert by_name[package]["kinds"][kind] == [name], by_name
        assert by_name[package]["from_source"] is False, by_name  # a wheel: its version says
    assert "cosine" in by_name["geospec"]["kinds"]["schedule"]
    [broken] = [e for e in data["errors"] if e["name"] == "geospec-broken"]
    assert broken["version"] == "0.0.1" and "geospec_missing_dependency" in broken["error"], broken

    valid = geospec("validate", str(HERE / "geospec-cka" / "spec.toml"))
    assert valid.returncode == 0, valid.stdout + valid.stderr
    assert "cka/spherical" in valid.stdout
    assert "geospec-broken" in valid.stderr  # broken plugins are reported loudly, not fatally

    spec = (HERE / "geospec-cka" / "spec.toml").read_text().replace('"cka"', '"from-broken"')
    path = Path("broken-kind.toml")
    path.write_text(spec)
    invalid = geospec("validate", str(path))
    assert invalid.returncode == 2, invalid
    assert "geospec-broken 0.0.1 failed to load" in invalid.stderr, invalid.stderr
    assert "Traceback" not in invalid.stderr

    for package in EXAMPLES:
        tests = HERE / package / "tests"
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 str(tests)])  # fmt: skip
        assert result.returncode == 0, f"{package}: its tests failed"
    print("plugins: OK")


if __name__ == "__main__":
    sys.exit(main())
