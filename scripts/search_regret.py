"""Every arm's regret against one arm of a committed prune study (issue 46: "every arm's regret
against the searched allocation, per corpus, with intervals").

Usage: ``python scripts/search_regret.py docs/results/NAME/prune.json --against searched-shift``.
Prints, per keep fraction, a markdown table: one row per arm (a sweep such as OWL's grid as the
setting its calibration loss chose, never the eval's), one column per eval corpus, each cell the
arm's mean paired difference in loss from ``--against`` over calibration seeds (positive: worse
than it), its 95% bootstrap interval over seeds x eval windows, and, where below 0.05, its p
Holm-adjusted across the table's rows: the prune report's own computation
(:func:`geospec.report.prune.budget_rows`), on the rows this table asks for.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from geospec.report.prune import budget_rows, unchosen_settings


def table(prune: dict[str, Any], budget: dict[str, Any], against: str) -> list[str]:
    """The markdown lines of one keep fraction's regret table."""
    dropped = unchosen_settings(budget)
    arms = [name for name in budget["arms"] if name not in dropped and name != against]
    rows = budget_rows(prune, budget, [(name, against) for name in arms])
    corpora = list(dict.fromkeys(row[3] for row in rows))
    cells: dict[str, dict[str, str]] = {}
    arm = ""
    for row in rows:
        arm = row[0] or arm
        mean, crossed, holm = row[5], row[9], row[-1]
        p = f" p {float(holm):.2g}" if holm not in ("-", "") and float(holm) < 0.05 else ""
        cells.setdefault(arm, {})[row[3]] = f"{mean} {crossed}{p}"
    lines = [
        f"keep {budget['keep']:g}, against {against}:",
        "",
        "| arm | " + " | ".join(corpora) + " |",
        "|---|" + "---|" * len(corpora),
    ]
    lines += [f"| {name} | " + " | ".join(cells[name][c] for c in corpora) + " |" for name in arms]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("prune_json", type=Path)
    parser.add_argument("--against", required=True, help="the arm every other is compared with")
    args = parser.parse_args()
    prune = json.loads(args.prune_json.read_text(encoding="utf-8"))
    for budget in prune["budgets"]:
        if args.against not in budget["arms"]:
            raise SystemExit(f"{args.prune_json}: no arm {args.against!r} at keep {budget['keep']}")
        print("\n".join(table(prune, budget, args.against)), end="\n\n")


if __name__ == "__main__":
    main()
