"""The state of one run that every stage sees (not the spec: each stage gets its own sections),
and the plan a stage hands the executor.

A stage is a small frozen dataclass built by ``from_spec(spec)`` from the spec sections it
depends on. It declares in ``reads`` the earlier stages whose keys or outputs it uses, and
``plan(run, upstream, forced)`` sees only those, through an :class:`Upstream` view; it returns a
:class:`Plan`: its key, the artifacts that prove it finished, and the work to do (``run``) or
the outputs to read back (``load``). The executor (:mod:`geospec.pipeline.executor`) decides,
for every stage alike, whether to skip it or run it and record its key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from rich.console import Console

if TYPE_CHECKING:
    from geospec.engine.distributed import DistContext
    from geospec.engine.token_data import TokenData
    from geospec.spec.sections import DataSpec, Spec


@dataclass(frozen=True)
class RunContext:
    """Where the run lives and how it talks: the run directory, the spec's folder (relative
    paths in a spec are relative to it), the console, the torchrun place and the device."""

    run_dir: Path
    spec_dir: Path
    console: Console
    dist: DistContext
    device: str = "auto"
    """Where models run in every stage ('auto': cuda when available)."""
    spec_path: Path | None = None
    """The spec file being run (for a launcher whose later job runs the pipeline again)."""
    overrides: tuple[str, ...] = ()
    """The ``--set`` values the spec was loaded with (passed on with ``spec_path``)."""
    arms: tuple[str, ...] | None = None
    """Train only these arms (``geospec run --arms``; None: every arm)."""
    seeds: tuple[int, ...] | None = None
    """Train only these seeds (``geospec run --seeds``; None: every seed)."""
    prune_arms: tuple[str, ...] | None = None
    """Compute only these [prune] arms' units (``geospec prune --arms``: an arm's name, or a
    grid arm's for every setting; None: every arm)."""
    prune_keep: tuple[float, ...] | None = None
    """Compute only the units at these keep fractions (``geospec prune --keep``; None: all)."""

    @property
    def is_main(self) -> bool:
        return self.dist.is_main

    def say(self, message: str) -> None:
        if self.is_main:
            self.console.print(message, highlight=False, soft_wrap=True)  # logs: no 80-col wrap

    def token_data(self, data: DataSpec) -> TokenData:
        """Tokens of a data section, prepared once per machine in the shared token cache
        (:func:`geospec.engine.token_data.shared_cache_dir`), keyed by the section and the source
        files' contents. A run directory's own data/ (where earlier versions kept them) is
        still read."""
        from geospec.engine.token_data import prepare_data, shared_cache_dir

        return prepare_data(
            data,
            shared_cache_dir(),
            spec_dir=self.spec_dir,
            say=self.say,
            earlier=[self.run_dir / "data"],
            progress=True,
        )


#: What a stage's ``run`` returns when it did only part of its work (runs held by another
#: process or sent to a scheduler): neither its key nor those of the stages after it (the report
#: of part of the runs) are recorded, so the next ``geospec run`` finishes them.
INCOMPLETE: Any = object()


@dataclass(frozen=True)
class Plan:
    """What the executor needs to decide about one stage and to carry it out.

    The stage is up to date when ``current`` says so, or (``current`` None) when it is not forced,
    its stored key equals ``key``, every artifact exists and ``problem`` is None (an artifact that
    exists but cannot be trusted: damaged, or changed behind geospec's back; it is said and the
    stage runs again). ``key`` None means the stage does not apply (nothing is recorded; only
    ``note`` is said, if any; ``load`` gives its output). ``note`` replaces the "up to date"
    line. ``main_only`` stages run on rank 0 while the other ranks wait; those ranks then
    ``load`` the outputs.
    """

    key: str | None
    run: Callable[[], Any] = lambda: None
    load: Callable[[], Any] = lambda: None
    artifacts: tuple[Path, ...] = ()
    problem: str | None = None
    current: bool | None = None
    note: str | None = None
    main_only: bool = True


@dataclass(frozen=True)
class Done:
    """A stage the executor has handled: its key, its outputs, and whether it did work."""

    key: str | None
    output: Any = None
    ran: bool = False


#: The stages whose outputs are profiles (name -> per-layer values), merged in this order by
#: :meth:`Upstream.profiles`: a later stage's profile of the same name would win (none share one).
PROFILE_STAGES = ("measure", "diagnose", "demand")


class UndeclaredRead(RuntimeError):
    """A stage read an upstream stage it does not declare in ``reads`` (a bug in the stage)."""


@dataclass(frozen=True)
class Upstream:
    """What one stage may see of the stages before it: those it declares in ``reads``.

    Reading any other stage raises :class:`UndeclaredRead`, so a stage's ``reads`` is the whole
    truth about what its key and its work depend on (tests/test_architecture.py draws the stage
    graph from it and checks docs/architecture.md's against it).
    """

    stage: str
    reads: tuple[str, ...]
    done: Mapping[str, Done]

    def _done(self, name: str) -> Done:
        if name not in self.reads:
            raise UndeclaredRead(
                f"the {self.stage} stage read the {name} stage, which its `reads` "
                f"({', '.join(self.reads) or 'nothing'}) does not declare"
            )
        return self.done[name]

    def key(self, name: str) -> str | None:
        """The key of upstream stage ``name`` (None: it does not apply to this spec)."""
        return self._done(name).key

    def output(self, name: str) -> Any:
        """What upstream stage ``name`` returned (or read back when it was skipped)."""
        return self._done(name).output

    def profiles(self) -> dict[str, list[float]]:
        """Every profile of the profile stages this stage reads (measured, diagnostic, demand),
        by name; a stage that did not apply adds none."""
        merged: dict[str, list[float]] = {}
        for name in PROFILE_STAGES:
            if name in self.reads:
                merged.update(self.output(name) or {})
        return merged

    def widths(self) -> dict[str, list[int]]:
        """Every arm's widths, from the solve stage."""
        widths: dict[str, list[int]] = self.output("solve")
        return widths

    def any_ran(self) -> bool:
        """Whether any stage this one reads did work in this run."""
        return any(self._done(name).ran for name in self.reads)


class Stage(Protocol):
    name: ClassVar[str]
    reads: ClassVar[tuple[str, ...]]
    """The earlier stages whose keys or outputs this stage uses (its edges in the stage graph)."""

    @classmethod
    def from_spec(cls, spec: Spec) -> Stage: ...

    def plan(self, run: RunContext, upstream: Upstream, forced: bool) -> Plan: ...
