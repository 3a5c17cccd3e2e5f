"""One table across committed search studies (issue 55): every heuristic's regret against the
study's searched allocation, on held-out text, with the search's generations to its stop.

Usage::

    python scripts/search_regret_families.py --roles uniform,protect-ends,geometric \\
        "SmolLM2 cut=PATH/prune.json@searched-shift:uniform,protect-ends,shift-spherical" \\
        ...

Each study is ``LABEL=PRUNE_JSON@SEARCHED:ARM,ARM,...``: the searched arm every other is compared
with (named by the study's design, never chosen by an eval loss), and the study's arm for each of
``--roles`` in order. A cell is the arm's regret in nats: its loss above the searched arm's, the
mean over calibration seeds, as its mean over the study's eval corpora and its worst corpus
(``mean / worst``; negative: the heuristic beat the search). Every keep fraction a study holds
gets its own row. The last column: the generation at which each seed's search stopped, and why.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def seed_mean(losses: dict[str, float]) -> float:
    """An arm's loss on one corpus: the mean over its calibration seeds."""
    return sum(float(v) for v in losses.values()) / len(losses)


def regrets(budget: dict[str, Any], arm: str, searched: str) -> list[float]:
    """``arm``'s loss above ``searched``'s on each eval corpus (mean over seeds)."""
    mine, theirs = budget["arms"][arm]["loss"], budget["arms"][searched]["loss"]
    return [seed_mean(mine[corpus]) - seed_mean(theirs[corpus]) for corpus in theirs]


def stops(budget: dict[str, Any], searched: str) -> str:
    """Where each seed's search stopped: ``30 (cap)`` or ``17 (patience)``; a search recorded
    before ``patience`` existed ran to its cap."""
    found = budget["arms"][searched].get("search", {})
    shown = []
    for seed in sorted(found):
        ran = len(found[seed].get("fitness", []))
        stopped = found[seed].get("stopped", {"by": "generations", "generation": ran})
        why = "cap" if stopped["by"] == "generations" else stopped["by"]
        shown.append(f"{stopped['generation']} ({why})")
    return ", ".join(shown) or "-"


def parse_study(entry: str, roles: int) -> tuple[str, Path, str, list[str]]:
    """``LABEL=PATH@SEARCHED:ARM,...`` as its parts; exits with the fix where malformed."""
    label, _, rest = entry.partition("=")
    path, _, rest = rest.partition("@")
    searched, _, arms = rest.partition(":")
    names = [a for a in arms.split(",") if a]
    if not (label and path and searched) or len(names) != roles:
        raise SystemExit(
            f"{entry!r}: write LABEL=PRUNE_JSON@SEARCHED:ARM,... with one arm per role ({roles})"
        )
    if not Path(path).is_file():
        raise SystemExit(f"{entry!r}: {path}: no such prune.json")
    return label, Path(path), searched, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="+", metavar="LABEL=PRUNE_JSON@SEARCHED:ARM,...")
    parser.add_argument("--roles", required=True, help="the heuristics' column names, in order")
    args = parser.parse_args()
    roles = args.roles.split(",")
    print("| study | keep | " + " | ".join(roles) + " | search stopped at (per seed) |")
    print("|---|---|" + "---|" * len(roles) + "---|")
    for entry in args.studies:
        label, path, searched, arms = parse_study(entry, len(roles))
        prune = json.loads(path.read_text(encoding="utf-8"))
        for budget in prune["budgets"]:
            missing = [a for a in [searched, *arms] if a not in budget["arms"]]
            if missing:
                raise SystemExit(f"{path}: keep {budget['keep']:g} has no arm {missing[0]!r}")
            cells = []
            for arm in arms:
                r = regrets(budget, arm, searched)
                cells.append(f"{sum(r) / len(r):+.3f} / {max(r):+.3f}")
            keep = f"{budget['keep']:g}"
            print(f"| {label} | {keep} | " + " | ".join(cells) + f" | {stops(budget, searched)} |")


if __name__ == "__main__":
    main()
