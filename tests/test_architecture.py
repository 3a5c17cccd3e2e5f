"""The package's boundaries, read from the source with ``ast`` (docs/architecture.md, "Rules").

- the core never imports the builtin plugins: they arrive through the hooks like any plugin;
- the builtins import only the public plugin API, as a third-party plugin would;
- no import cycle among geospec's modules, counting every import statement: at module level,
  inside functions and methods (a late import hides a loop, it does not remove it), and type-only;
- the report reads the run directory below the pipeline's stages, never through them;
- a stage never imports the executor, nor a later stage;
- the commands that only read specs, and ``--help``, never import torch or numpy.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "geospec"
BUILTINS = ROOT / "plugins"
PUBLIC_PLUGIN_API = {
    "geospec",
    "geospec.kinds",
    "geospec.plugin",
    "geospec.errors",
    "geospec.prune.evolve",  # the search the evolve schedule runs, torch-free
}
STAGE_ORDER = [
    "reference",
    "probe",
    "measure",
    "diagnose",
    "demand",
    "solve",
    "prune",
    "train",
    "eval",
    "report",
]


def module_name(path: Path, root: Path, package: str) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path, package: str) -> dict[str, Path]:
    return {module_name(p, root, package): p for p in sorted(root.rglob("*.py"))}


def core_modules() -> dict[str, Path]:
    return package_modules(CORE, "geospec")


def imports(path: Path, root: Path = CORE, package: str = "geospec") -> Iterator[str]:
    """Modules imported by ``path`` (a module of ``package``, whose sources are under ``root``, or
    a file outside it), by every import statement in it: at module level, inside functions and
    methods, and under ``if TYPE_CHECKING`` (a type-only loop is still a tangle). ``from a.b
    import c`` yields ``a.b.c`` when that is a module of ``package``, else ``a.b``."""
    modules = package_modules(root, package)
    tree = ast.parse(path.read_text())
    base_package = module_name(path, root, package) if path.is_relative_to(root) else ""
    if path.name != "__init__.py":
        base_package = base_package.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                levels = base_package.split(".")
                base = ".".join(levels[: len(levels) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield candidate if candidate in modules else base


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of ``package`` and the modules of ``package`` it imports (itself left out)."""
    modules = package_modules(root, package)
    return {
        name: {i for i in imports(path, root, package) if i in modules and i != name}
        for name, path in modules.items()
    }


def test_the_core_never_imports_the_builtin_plugins() -> None:
    offenders = {
        name: sorted(i for i in imports(path) if i.split(".")[0] == "geospec_plugins")
        for name, path in core_modules().items()
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_builtins_import_only_the_public_plugin_api() -> None:
    offenders = {}
    for path in sorted(BUILTINS.rglob("*.py")):
        used = {i for i in imports(path) if i.split(".")[0] == "geospec"}
        if used - PUBLIC_PLUGIN_API:
            offenders[str(path.relative_to(BUILTINS))] = sorted(used - PUBLIC_PLUGIN_API)
    assert offenders == {}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if state.get(successor) == 1:
                return [*path[path.index(successor) :], successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_in_geospec() -> None:
    assert find_cycle(import_graph(CORE, "geospec")) is None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_an_import_inside_a_function_closes_a_loop(tmp_path: Path) -> None:
    """A late import (in a function, a method, a type-only block) is an edge of the graph: the
    loop it closes is found, and the same package without it has none."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("from .. import c\n")
    (package / "c.py").write_text("import os\n\n\ndef f():\n    return os.sep\n")
    assert find_cycle(import_graph(package, "pkg")) is None
    late = {
        "in a function": "def f():\n    from pkg import a\n",
        "in a method": "class C:\n    def m(self):\n        import pkg.a\n",
        "type-only": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import x\n",
    }
    for where, source in late.items():
        (package / "c.py").write_text(source)
        cycle = find_cycle(import_graph(package, "pkg"))
        assert cycle == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"], where


def test_the_report_reads_the_run_directory_below_the_stages() -> None:
    """``report/`` reads artifacts through ``geospec.rundir.records`` (below both), never through a
    stage module: the report stage imports ``report/``, so the other way would be a loop of
    packages even where no two modules import each other."""
    offenders = {
        name: sorted(i for i in imports(path) if i.startswith("geospec.pipeline.stages"))
        for name, path in core_modules().items()
        if name.startswith("geospec.report.")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_a_stage_imports_neither_the_executor_nor_a_later_stage() -> None:
    assert sorted(p.stem for p in (CORE / "pipeline" / "stages").glob("[!_]*.py")) == sorted(
        STAGE_ORDER
    )
    for index, stage in enumerate(STAGE_ORDER):
        used = set(imports(CORE / "pipeline" / "stages" / f"{stage}.py"))
        assert "geospec.pipeline.executor" not in used, stage
        later = {f"geospec.pipeline.stages.{s}" for s in STAGE_ORDER[index + 1 :]}
        assert not used & later, (stage, sorted(used & later))


@pytest.mark.parametrize("command", ["validate", "plugins", "schema", "widths", "--help"])
def test_spec_reading_commands_never_import_torch_or_numpy(command: str, tmp_path: Path) -> None:
    args = {
        "validate": [str(ROOT / "specs" / "tiny.toml")],
        "plugins": ["--json"],
        "schema": [],
        "widths": [str(ROOT / "specs" / "tiny.toml"), "--json"],
        "--help": [],  # lists every command, so loads every command's module
    }[command]
    (tmp_path / "runs").mkdir()
    script = (
        "import sys\n"
        "from geospec.cli import main\n"
        f"sys.argv = ['geospec', {command!r}, *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert not exit.code, exit.code\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy'})\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_one_stage_list_everywhere() -> None:
    """README, `geospec run --help`, docs/pipeline.md's table, docs/diagnostics.md and
    `geospec status` list the executor's stages, all of them, in its order."""
    import re

    from click.testing import CliRunner

    from geospec.cli import cli
    from geospec.pipeline.executor import STAGES
    from geospec.pipeline.status import STAGE_NAMES

    assert STAGE_NAMES == STAGES
    listed = ", ".join(STAGES)
    readme = (ROOT / "README.md").read_text()
    assert f"the whole pipeline ({listed})" in readme
    help_text = " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split())
    assert f"Run the pipeline of SPEC: {listed} (" in help_text
    diagnostics = " ".join((ROOT / "docs" / "diagnostics.md").read_text().split())
    assert f"(`STAGES`: {listed};" in diagnostics
    table = (ROOT / "docs" / "pipeline.md").read_text()
    rows = re.findall(r"^\| (\w+) \| ", table, re.M)
    assert [row for row in rows if row in STAGES] == list(STAGES)


def test_the_stage_graph_in_the_docs_is_the_one_the_stages_declare() -> None:
    """docs/architecture.md's stage-graph table lists every stage, in order, with exactly the
    upstream stages its ``reads`` declares."""
    from geospec.pipeline.executor import stage_graph

    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## The stage graph", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    documented: dict[str, tuple[str, ...]] = {}
    for row in rows[1:]:  # the header first
        stage, reads = (cell.strip() for cell in row.strip("|").split("|"))
        documented[stage] = () if reads == "(none)" else tuple(r.strip() for r in reads.split(","))
    assert documented == stage_graph()
    assert list(documented) == STAGE_ORDER


def test_every_stage_reads_only_earlier_stages() -> None:
    from geospec.pipeline.executor import STAGE_TYPES

    seen: set[str] = set()
    for stage in STAGE_TYPES:
        assert set(stage.reads) <= seen, (stage.name, stage.reads)
        seen.add(stage.name)


def test_a_stage_that_reads_an_undeclared_stage_fails() -> None:
    from geospec.pipeline.context import Done, UndeclaredRead, Upstream

    done = {
        "measure": Done("m", {"gw/raw": [1.0, 2.0]}),
        "diagnose": Done("d", {"sensitivity/scale": [0.5, 0.1]}),
        "demand": Done("x", {"demand/lambda": [3.0, 4.0]}),
        "solve": Done("s", {"uniform": [64, 64]}),
    }
    upstream = Upstream("prune", ("measure", "demand"), done)
    assert upstream.key("measure") == "m"
    # only the declared profile stages are merged
    assert upstream.profiles() == {"gw/raw": [1.0, 2.0], "demand/lambda": [3.0, 4.0]}
    with pytest.raises(UndeclaredRead, match="the prune stage read the solve stage"):
        upstream.widths()
    with pytest.raises(UndeclaredRead, match="diagnose"):
        upstream.output("diagnose")


#: geospec's packages bottom to top: a package imports only its own floor and those below
#: (docs/architecture.md, "Packages in layers"). A top-level module counts as a package.
FLOORS: list[set[str]] = [
    {"version", "errors", "storage", "rundir", "stats", "hub", "hardware", "shapes", "profiles",
     "rounding", "plugin_base", "kinds", "moved", "data"},
    {"registry", "plugin"},
    {"spec"},
    {"solve"},
    {"engine", "measure", "evaluate"},
    {"prune"},
    {"report"},
    {"pipeline"},
    {"testing", "pytest_plugin", "cli", "geospec", "__main__"},
]  # fmt: skip


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "geospec"


def test_no_package_imports_a_package_above_it() -> None:
    """Counting every import (module level, in functions, type-only), as the module test does."""
    floor = {package: level for level, packages in enumerate(FLOORS) for package in packages}
    upward: dict[tuple[str, str], list[str]] = {}
    for module, imported in import_graph(CORE, "geospec").items():
        for other in imported:
            low, high = package_of(module), package_of(other)
            assert low in floor and high in floor, f"{module} or {other}: give it a floor"
            if floor[high] > floor[low]:
                upward.setdefault((low, high), []).append(f"{module} -> {other}")
    assert not upward, f"imports up a floor: {upward}"


def test_the_floors_in_the_docs_are_the_ones_the_test_holds() -> None:
    """docs/architecture.md's "Packages in layers" list names the packages of each floor, bottom
    to top, as :data:`FLOORS` does (the top floor's 0.1.0 names are summed up in words)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Packages in layers", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. (.*(?:\n   .*)*)", section, flags=re.M)
    documented = [set(re.findall(r"`([a-z_]+)`", item.split(" (")[0])) for item in items]
    assert len(documented) == len(FLOORS)
    assert documented[:-1] == FLOORS[:-1]
    assert documented[-1] <= FLOORS[-1]
