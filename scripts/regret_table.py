"""The regret table across committed pruning studies (issue 47): in every cell (model x keep
fraction x eval corpus), each arm's mean loss above the best arm's of that cell, in nats.

Usage: ``python scripts/regret_table.py [--arms a,b,...] NAME=prune.json ...``. Every study is
read from its committed prune.json (docs/results/*/prune.json); an arm's loss in a cell is its
mean over calibration seeds. The best arm of a cell is the best of the arms compared (``--arms``,
default: the arms every study has, after the renames in ALIASES), so a regret is against an arm
a user could have chosen in every study. OWL enters as the setting of its grid that the study's
own calibration windows chose (prune.json's ``sweeps``), never the one the eval text would pick.
Prints, per study, one row per arm (its regret in every cell), then, over all cells, each arm's
worst and mean regret, and the arms ranked by worst-case regret.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

#: The same allocation under another name in one study: Gemma's spec called protect-first
#: "protect".
ALIASES = {"protect": "protect-first"}


def arm_losses(record: dict[str, Any]) -> dict[tuple[float, str], dict[str, float]]:
    """Per (keep, corpus): every arm's mean loss over the calibration seeds, OWL's grid
    collapsed to its calibration-chosen setting (as "owl")."""
    cells: dict[tuple[float, str], dict[str, float]] = {}
    corpora = [Path(c).name if not c.startswith("bundled:") else c[8:] for c in record["corpora"]]
    for budget in record["budgets"]:
        chosen = {found["best"]: sweep for sweep, found in budget.get("sweeps", {}).items()}
        swept = {
            name
            for found in budget.get("sweeps", {}).values()
            for name in found["calibration_loss"]
        }
        for name, arm in budget["arms"].items():
            if name in swept and name not in chosen:
                continue  # a grid setting the calibration windows did not choose
            label = chosen.get(name, ALIASES.get(name, name))
            for corpus, label_corpus in zip(record["corpora"], corpora, strict=True):
                values = [float(v) for v in arm["loss"][corpus].values()]
                cells.setdefault((budget["keep"], label_corpus), {})[label] = sum(values) / len(
                    values
                )
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("studies", nargs="+", metavar="NAME=prune.json")
    parser.add_argument("--arms", help="the arms compared (default: those every study has)")
    args = parser.parse_args()
    studies = {}
    for entry in args.studies:
        name, _, path = entry.partition("=")
        if not Path(path).is_file():
            sys.exit(f"{path}: no such prune.json")
        studies[name] = arm_losses(json.loads(Path(path).read_text()))
    common = set.intersection(
        *(set.intersection(*(set(arms) for arms in cells.values())) for cells in studies.values())
    )
    arms = args.arms.split(",") if args.arms else sorted(common)
    missing = [arm for arm in arms if arm not in common]
    if missing:
        sys.exit(f"--arms: {', '.join(missing)} not in every study (common: {sorted(common)})")
    every: dict[str, list[float]] = {arm: [] for arm in arms}
    for name, cells in studies.items():
        keys = sorted(cells, key=lambda cell: (-cell[0], cell[1]))
        print(
            f"\n{name}: regret in nats (the arm's mean loss above the best of {len(arms)} arms)\n"
        )
        print("| arm | " + " | ".join(f"{keep:g} {corpus}" for keep, corpus in keys) + " |")
        print("|---|" + "---|" * len(keys))
        best = {cell: min(cells[cell][arm] for arm in arms) for cell in keys}
        for arm in arms:
            regrets = [cells[cell][arm] - best[cell] for cell in keys]
            every[arm] += regrets
            shown = [
                "**0**" if math.isclose(r, 0.0, abs_tol=1e-12) else f"{r:.3f}" for r in regrets
            ]
            print(f"| {arm} | " + " | ".join(shown) + " |")
    cells_total = len(next(iter(every.values())))
    print(f"\nAll {cells_total} cells: worst-case and mean regret, ranked by worst case\n")
    print("| arm | worst | mean | cells where best |")
    print("|---|---|---|---|")
    for arm in sorted(arms, key=lambda arm: max(every[arm])):
        regrets = every[arm]
        wins = sum(math.isclose(r, 0.0, abs_tol=1e-12) for r in regrets)
        print(f"| {arm} | {max(regrets):.3f} | {sum(regrets) / len(regrets):.3f} | {wins} |")


if __name__ == "__main__":
    main()
