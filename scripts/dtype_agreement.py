"""What a compute dtype changes in a prune: two prune.json of the same spec, computed in float32
and in another dtype (``prune.compute_dtype`` and the probe's, diagnose's and demand's), compared
unit by unit and comparison by comparison, as the report reads them (docs/prune.md, "Compute
dtype and threads").

    python scripts/dtype_agreement.py docs/results/smollm2-135m-prune/prune.json \\
        runs/smollm2-bf16/prune.json --spec specs/smollm2-135m-prune.toml

Prints markdown: how many units kept the same widths, the largest change of a unit's held-out
loss (where the widths are equal, and overall), the largest change of a paired difference (every
arm against the baseline and the spec's report.compare rows), and every row whose sign or Holm
verdict (adjusted p < 0.05) differs between the two.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from geospec.report.prune import budget_rows
from geospec.spec.loading import load_spec

#: budget_rows' columns: arm, widths, params, corpus, perplexity, Δ, CI, better, p, CI, p (Holm)
ARM, CORPUS, DELTA, HOLM = 0, 3, 5, 10
LEVEL = 0.05


def unit_changes(
    exact: Mapping[str, Any], other: Mapping[str, Any]
) -> tuple[int, int, float, float]:
    """Units with equal widths, units in all, and the largest |loss change| where the widths
    are equal and overall."""
    same = total = 0
    equal_widths = overall = 0.0
    for budget, theirs in zip(exact["budgets"], other["budgets"], strict=True):
        for name, arm in budget["arms"].items():
            them = theirs["arms"][name]
            for seed, widths in arm["widths"].items():
                total += 1
                moved = max(
                    abs(float(them["loss"][corpus][seed]) - float(losses[seed]))
                    for corpus, losses in arm["loss"].items()
                )
                overall = max(overall, moved)
                if widths == them["widths"][seed]:
                    same += 1
                    equal_widths = max(equal_widths, moved)
    return same, total, equal_widths, overall


def verdict(row: Sequence[str]) -> str:
    """A comparison row's reading: better, worse (Holm-adjusted p < 0.05) or no verdict."""
    if row[HOLM] in ("-", "") or float(row[HOLM]) >= LEVEL:
        return "no verdict"
    return "better" if float(row[DELTA]) < 0 else "worse"


def compared(
    exact: Mapping[str, Any], other: Mapping[str, Any], pairs: Sequence[tuple[str, str]]
) -> tuple[float, int, list[list[str]]]:
    """The largest |change of a paired difference|, the rows compared, and the rows whose sign or
    verdict changed (keep, arm, against, corpus, Δ and verdict in each dtype)."""
    largest, count, changed = 0.0, 0, []
    for budget, theirs in zip(exact["budgets"], other["budgets"], strict=True):
        tables = [(None, budget_rows(exact, budget), budget_rows(other, theirs))]
        if pairs:
            tables.append(
                (pairs, budget_rows(exact, budget, pairs), budget_rows(other, theirs, pairs))
            )
        for chosen, ours, their_rows in tables:
            arm = ""
            for row, them in zip(ours, their_rows, strict=True):
                arm = row[ARM] or arm
                if row[DELTA] == "-":
                    continue
                count += 1
                against = exact["baseline"] if chosen is None else dict(chosen).get(arm, "")
                moved = abs(float(them[DELTA]) - float(row[DELTA]))
                largest = max(largest, moved)
                sign = (float(row[DELTA]) < 0) != (float(them[DELTA]) < 0)
                if sign or verdict(row) != verdict(them):
                    changed.append(
                        [f"{budget['keep']:g}", arm, against, row[CORPUS], row[DELTA],
                         verdict(row), them[DELTA], verdict(them)]
                    )  # fmt: skip
    return largest, count, changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exact", type=Path, help="the float32 prune.json")
    parser.add_argument("other", type=Path, help="the same prune in another dtype")
    parser.add_argument("--spec", type=Path, help="the spec (its report.compare rows)")
    args = parser.parse_args()
    exact, other = (json.loads(path.read_text()) for path in (args.exact, args.other))
    pairs = [tuple(p) for p in load_spec(args.spec).report.compare] if args.spec else []
    dtype = other.get("compute_dtype", "float32")
    same, total, equal_widths, overall = unit_changes(exact, other)
    largest, count, changed = compared(exact, other, pairs)  # type: ignore[arg-type]
    print(f"- units with the same widths in float32 and {dtype}: {same} of {total}")
    print(
        f"- largest change of a unit's mean held-out loss: {equal_widths:.4f} nats where the "
        f"widths are the same, {overall:.4f} overall"
    )
    print(
        f"- largest change of a paired difference ({count} rows: every arm against the "
        f"baseline, and report.compare): {largest:.4f} nats"
    )
    print(f"- rows whose sign or Holm verdict (p < {LEVEL}) changed: {len(changed)}")
    if changed:
        print()
        print(f"| keep | arm | against | corpus | Δ float32 | verdict | Δ {dtype} | verdict |")
        print("|---|---|---|---|---:|---|---:|---|")
        for row in changed:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
