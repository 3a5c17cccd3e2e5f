"""Tables on the terminal: the results (``geospec run``/``report``) and the diagnostics
(``geospec diagnose``), from the same rows as report.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from geospec.report.diagnostics import (
    LAYER_HEADERS,
    PAIR_HEADERS,
    PROFILE_HEADERS,
    layer_rows,
    pair_rows,
    profile_rows,
    summary_lines,
)
from geospec.report.markdown import (
    CHOSEN_HEADERS,
    EVAL_HEADERS,
    SOURCE_HEADERS,
    chosen_rows,
    eval_rows,
    headers,
    source_rows,
    table_rows,
)
from geospec.report.results import CHECKS


def print_table(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"geospec: {results['name']}")
    for header in headers(results):
        table.add_column(header, justify="left" if header == "arm" else "right")
    for row in table_rows(results):
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)  # logs and pipes: don't wrap the table at 80 columns
    if not results.get("probe_only"):  # nothing trained: no table of losses that never exist
        console.print(table)
    for title, columns, rows in (
        ("derived arms against their source", SOURCE_HEADERS, source_rows(results)),
        ("the spec's own comparisons (report.compare)", CHOSEN_HEADERS, chosen_rows(results)),
    ):
        if rows:
            pairs = Table(title=title)
            for header in headers(results, columns):  # the two arm names left, numbers right
                pairs.add_column(header, justify="left" if header in columns[:2] else "right")
            for row in rows:
                pairs.add_row(*row)
            console.print(pairs)
    scores = eval_rows(results)
    if scores:
        downstream = Table(title="downstream evaluation (lm-eval)")
        for header in headers(results, EVAL_HEADERS):
            left = header in ("task / metric", "arm")
            downstream.add_column(header, justify="left" if left else "right")
        for row in scores:
            downstream.add_row(*row)
        console.print(downstream)
    for note in results.get("notes", []):
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    if not results["equal_params"]:
        console.print("[bold red]warning:[/] arms do not have equal parameter counts")
    for key, value in results.get("checks", {}).items():
        if value is False:
            console.print(f"[bold red]warning:[/] not every run has the {CHECKS[key]}")


def print_diagnostics(diagnostics: Mapping[str, Any], console: Any = None) -> None:
    """The same tables on the terminal (``geospec diagnose``)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    for column_names, rows, title in (
        (LAYER_HEADERS, layer_rows(diagnostics), "per layer"),
        (PROFILE_HEADERS, profile_rows(diagnostics), "work profiles (* scale-sensitive)"),
        (PAIR_HEADERS, pair_rows(diagnostics), "least additive layer pairs"),
    ):
        if not rows:
            continue
        table = Table(title=f"diagnostics: {title}", title_justify="left")
        for header in column_names:
            table.add_column(header, justify="left" if header in ("profile", "layers") else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for line in summary_lines(diagnostics):
        console.print(line, highlight=False)


def print_demand(demand: Mapping[str, Any], console: Any = None) -> None:
    """The report's demand tables on the terminal (``geospec demand``)."""
    from rich.console import Console
    from rich.table import Table

    from geospec.report import demand as rows

    console = console or Console()
    for column_names, cells, title in (
        (rows.layer_headers(demand), rows.layer_rows(demand), "per layer"),
        (rows.correlation_headers(demand), rows.correlation_rows(demand), "profiles vs demand"),
    ):
        if not cells:
            continue
        table = Table(title=f"demand: {title}", title_justify="left")
        for header in column_names:
            table.add_column(header, justify="left" if header == "profile" else "right")
        for row in cells:
            table.add_row(*(cell.replace("**", "") for cell in row))
        console.print(table)
    for line in rows.summary_lines(demand):
        console.print(line, highlight=False)
