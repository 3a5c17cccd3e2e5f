"""Progress on stderr: a live bar on a terminal, one log line per interval otherwise."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def format_duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class TrainProgress:
    """Steps done, training loss, tokens/s and ETA; silent when not ``enabled``."""

    def __init__(self, total: int, enabled: bool = True, start: int = 0) -> None:
        self.total = total
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal
        self.start_step = start
        self.started = time.perf_counter()
        self._bar: Progress | None = None
        self._task = TaskID(0)

    def __enter__(self) -> TrainProgress:
        if self.live:
            self._bar = Progress(
                TextColumn("training"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(
                "train", total=self.total, completed=self.start_step, info=""
            )
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def advance(self, step: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def report(self, step: int, loss: float, tokens_per_s: float) -> None:
        """Called once per log interval."""
        if not self.enabled:
            return
        info = f"loss {loss:.4f}  {tokens_per_s:,.0f} tok/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
            return
        done = step - self.start_step
        elapsed = time.perf_counter() - self.started
        eta = elapsed / done * (self.total - step) if done else 0.0
        self.console.print(
            f"step {step}/{self.total}  {info}  eta {format_duration(eta)}", highlight=False
        )

    def note(self, message: str) -> None:
        if self.enabled:
            self.console.print(message, highlight=False)


class LogProgress:
    """Progress of a long loop for logs (stderr not a terminal): a line ``what: done/total, eta``
    at most every ``interval`` seconds, and one at the end; silent when not ``enabled``."""

    def __init__(
        self,
        say: Callable[[str], None],
        what: str,
        total: int,
        enabled: bool = True,
        interval: float = 5.0,
    ) -> None:
        self.say, self.what, self.total = say, what, total
        self.enabled, self.interval = enabled, interval
        self.done = 0
        self.started = self.last = time.perf_counter()

    def advance(self, done: int = 1) -> None:
        self.done += done
        now = time.perf_counter()
        if not self.enabled or (now - self.last < self.interval and self.done < self.total):
            return
        self.last = now
        elapsed = now - self.started
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        self.say(
            f"{self.what}: {self.done}/{self.total}  elapsed {format_duration(elapsed)}  "
            f"eta {format_duration(eta)}"
        )


class StageAdvance:
    """What :func:`stage_progress` yields: called with the work just done, it advances the bar
    (or the log line); :meth:`paused` takes the bar off the screen while a step inside the loop
    shows its own (a unit's healing: its training bar), since a terminal shows one live display
    at a time."""

    def __init__(self, bar: Progress, task: TaskID, log: LogProgress) -> None:
        self.bar, self.task, self.log = bar, task, log

    def __call__(self, done: int = 1) -> None:
        self.bar.advance(self.task, done)
        self.log.advance(done)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.bar.stop()  # transient: the bar is cleared, and shown again after
        try:
            yield
        finally:
            self.bar.start()


@contextmanager
def stage_progress(
    console: Console, say: Callable[[str], None], what: str, total: int, shown: bool = True
) -> Iterator[StageAdvance]:
    """Progress of one long loop of a stage, advanced by the :class:`StageAdvance` it yields: a
    transient bar on a terminal, a :class:`LogProgress` line every few seconds otherwise (logs,
    batch jobs); nothing when not ``shown`` (the ranks other than 0 under torchrun)."""
    terminal = console.is_terminal
    with Progress(console=console, transient=True, disable=not (shown and terminal)) as bar:
        task = bar.add_task(what, total=total)
        yield StageAdvance(bar, task, LogProgress(say, what, total, enabled=shown and not terminal))


def format_bytes(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000:
            return f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:,.1f} TB"


class DataProgress:
    """Tokenizing a corpus, for logs: documents, tokens, tokens/s, and where the corpus's size is
    known (``total()``: its documents) the ETA and the size the token files will take, projected
    from the tokens per document so far. A line every ``interval`` seconds and one at the end."""

    def __init__(
        self, say: Callable[[str], None], total: Callable[[], int | None], interval: float = 10.0
    ) -> None:
        self.say, self.total, self.interval = say, total, interval
        self.documents0 = self.tokens0 = self.itemsize = 0
        self.started = self.last = time.perf_counter()

    def start(self, documents: int, tokens: int, itemsize: int) -> None:
        """Counts already in the files (a resumed build) and the bytes of one token id."""
        self.documents0, self.tokens0, self.itemsize = documents, tokens, itemsize
        self.started = self.last = time.perf_counter()
        if documents:
            self.say(f"tokens: resuming after {documents:,} documents ({tokens:,} tokens)")

    def update(self, documents: int, tokens: int) -> None:
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            self.say(self.line(documents, tokens, now))

    def finish(self, documents: int, tokens: int) -> None:
        elapsed = time.perf_counter() - self.started
        self.say(
            f"tokens: {documents:,} documents, {tokens:,} tokens "
            f"({format_bytes(tokens * self.itemsize)}) in {format_duration(elapsed)}"
        )

    def line(self, documents: int, tokens: int, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = (tokens - self.tokens0) / elapsed
        documents_rate = (documents - self.documents0) / elapsed
        total = self.total()
        text = f"tokens: {documents:,}"
        if total:
            text += f"/{total:,}"
        text += f" documents, {tokens:,} tokens, {rate:,.0f} tokens/s"
        if total and documents and documents_rate > 0:
            eta = max(total - documents, 0) / documents_rate
            size = tokens / documents * total * self.itemsize
            text += f", eta {format_duration(eta)}, about {format_bytes(size)} on disk"
        return text
