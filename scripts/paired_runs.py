"""Two prune runs of the same arms on the same eval windows, compared (e.g. one spec calibrated
on two texts): per run and keep fraction, every arm's perplexity on each corpus (the mean loss
over calibration seeds) with its ratio to the unpruned model's, and select's ratio on its
own selection windows; then each arm's paired difference in loss, the first run minus the
second, with the prune report's 95% bootstrap interval over seeds x windows.

Usage: ``python scripts/paired_runs.py NAME=prune.json NAME=prune.json``
(docs/results/smollm2-135m-quickstart-mix).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def short(corpus: str) -> str:
    """A corpus's name in a table: its file name without suffixes, or the bundled name."""
    return corpus.removeprefix("bundled:").split("/")[-1].split(".")[0]


def mean_losses(arm: dict[str, Any], corpora: list[str]) -> dict[str, float]:
    """``arm``'s loss on each corpus, averaged over its calibration seeds."""
    return {c: sum(arm["loss"][c].values()) / len(arm["loss"][c]) for c in corpora}


def print_run(name: str, record: dict[str, Any]) -> None:
    corpora, unpruned = record["corpora"], record["reference"]
    shown = {short(c): round(math.exp(unpruned[c]), 2) for c in corpora}
    print(f"\n# {name}: unpruned perplexity {shown}")
    for budget in record["budgets"]:
        selection = budget["recommended"]["loss"]
        print(f"\n## keep {budget['keep']:g} (recommended {budget['recommended']['arm']})")
        print("| arm | select's ratio | " + " | ".join(short(c) for c in corpora) + " |")
        for arm_name, arm in budget["arms"].items():
            losses = mean_losses(arm, corpora)
            cells = [
                f"{math.exp(losses[c]):.2f} ({math.exp(losses[c] - unpruned[c]):.2f}x)"
                for c in corpora
            ]
            ratio = math.exp(selection[arm_name] - record["select_reference"])
            print(f"| {arm_name} | {ratio:.2f}x | " + " | ".join(cells) + " |")


def paired(first: dict[str, Any], second: dict[str, Any]) -> None:
    """Each arm's loss in ``first`` minus in ``second``, window by window: the mean and the
    prune report's crossed bootstrap over seeds x windows (:func:`geospec.stats.crossed_bootstrap`),
    as report.md's comparisons compute it."""
    from geospec.stats import crossed_bootstrap

    for one, other in zip(first["budgets"], second["budgets"], strict=True):
        for arm_name, arm in one["arms"].items():
            cells = []
            for corpus in first["corpora"]:
                mine = arm["window_loss"][corpus]
                theirs = other["arms"][arm_name]["window_loss"][corpus]
                table = [
                    [a - b for a, b in zip(mine[s], theirs[s], strict=True)] for s in sorted(mine)
                ]
                found = crossed_bootstrap(table)
                mean = sum(map(sum, table)) / sum(map(len, table))
                low, high = found.ci
                cells.append(f"{short(corpus)} {mean:+.3f} [{low:+.3f}, {high:+.3f}]")
            print(f"keep {one['keep']:g} {arm_name}: " + "; ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("runs", nargs=2, metavar="NAME=prune.json")
    args = parser.parse_args()
    records = {}
    for entry in args.runs:
        name, _, path = entry.partition("=")
        records[name] = json.loads(Path(path).read_text())
    for name, record in records.items():
        print_run(name, record)
    (a, first), (b, second) = records.items()
    if first["corpora"] != second["corpora"] or first["keep"] != second["keep"]:
        raise SystemExit(f"{a} and {b} score other corpora or keep fractions: not paired")
    print(f"\n# paired {a} - {b} (nats), bootstrap 95% over seeds x windows")
    paired(first, second)


if __name__ == "__main__":
    main()
