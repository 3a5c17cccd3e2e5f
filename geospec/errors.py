"""Errors a user can cause, each carrying the exit status the CLI reports.

The CLI prints ``str(error)`` and exits with ``error.exit_code``; a traceback is shown only with
``--debug``. Anything that is not a :class:`GeospecError` is a bug and is shown with its traceback.
"""

from __future__ import annotations


class GeospecError(Exception):
    """A failure the user can act on (exit status 1: the run failed)."""

    exit_code = 1


class SpecError(GeospecError):
    """The spec (or another input file) is invalid (exit status 2).

    ``problems`` holds one line per problem, each naming the dotted path of the offending key.
    """

    exit_code = 2

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self._format())

    def _format(self) -> str:
        if len(self.problems) == 1:
            return f"{self.source}: {self.problems[0]}"
        lines = [f"{self.source}: {len(self.problems)} problems"]
        lines += [f"  {problem}" for problem in self.problems]
        return "\n".join(lines)


class UsageError(GeospecError):
    """Bad input that is not a spec: a profiles file, a run directory, an option (exit status 2)."""

    exit_code = 2


class PluginError(GeospecError):
    """A plugin is missing, broken or misbehaving."""

    exit_code = 2


#: The exit status of a run stopped by SIGTERM or SIGUSR1 after writing a checkpoint at its
#: current step: "requeue me" (75 is EX_TEMPFAIL of sysexits.h, a temporary failure the caller
#: should retry). Started again, the run resumes from that checkpoint to the result an
#: uninterrupted run has.
REQUEUE_EXIT_CODE = 75


class Preempted(GeospecError):
    """Training stopped on SIGTERM or SIGUSR1 (a scheduler's warning before preemption or the
    time limit), or under torchrun because the launcher exited, after checkpointing its current
    step; exit status :data:`REQUEUE_EXIT_CODE`. ``signal`` names the signal (``SIGUSR1``: a
    warning, requeue me; ``SIGTERM``: stop; a scheduler that preempts with SIGTERM requeues the
    job itself); None for a lost launcher or a stop another process received."""

    exit_code = REQUEUE_EXIT_CODE

    def __init__(self, message: str, signal: str | None = None) -> None:
        super().__init__(message)
        self.signal = signal


def last_line(error: object) -> str:
    """The last line of an error's text (where a message or a tool's stderr says what went
    wrong), or the error's type name when the text is empty: what one-line reports show."""
    lines = str(error).strip().splitlines()
    return lines[-1] if lines else type(error).__name__


class OutOfSpace(GeospecError):
    """A write failed because its file system is full (or the user's quota is spent): exit
    status 2, one line naming the directory, the file and the free space. Every geospec write
    is atomic or in a scratch directory, so nothing partial is left under a final name, and
    the same command, run again once there is space, resumes where it stopped."""

    exit_code = 2

    def __init__(self, directory: str, file: str, free: str) -> None:
        self.directory, self.file, self.free = directory, file, free
        super().__init__(
            f"out of disk space in {directory} writing {file} ({free} free); free space there "
            "(or point out/--out or GEOSPEC_CACHE elsewhere) and run the same command again "
            "to resume"
        )


class OutOfMemory(GeospecError):
    """A model that cannot be trained in the memory the device has (refused before it is built,
    or an allocation that failed during a step): exit status 2, one line with the estimate and
    the settings that lower it (``train.micro_batch_size``, ``train.precision``,
    ``train.distributed``)."""

    exit_code = 2
