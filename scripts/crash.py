"""Crash consistency (``nox -s crash``): a quick pipeline SIGKILLed at N random instants, resumed
after each, ends exactly where an uninterrupted run does.

    python scripts/crash.py --seed 0 --kills 20          # one seed: exit 0 when consistent
    python scripts/crash.py --seed 3 --kills 40 --keep   # keep the work directory either way

The pipeline is small but has every stage that writes: the token cache, the reference model,
the probe's clouds, a measured profile, the widths, two arms x two seeds of training (with
checkpoints), and the report (results.json, report.md, plots). First it runs once without
interruption (the truth), then again in a fresh run directory and token cache, killed with
SIGKILL (no handler runs, nothing is flushed) N times and started again after each kill, then
let finish. Half the kills come after a random delay (uniformly anywhere in the work that is
left, start-up included); the other half the instant a temporary file appears in the run
directory or the cache, that is while geospec writes an artifact. A kill that finds nothing
more done than before makes the next wait longer, so slow first steps are passed too. When a
run finishes before its kill comes, its results are checked and a new round starts in a fresh
directory, until N kills have landed. Each round's final ``results.json``, ``widths.json`` and
every trained model's weights (byte for byte) must equal the truth's.

A failure keeps everything under ``crash-failures/seed-<S>/`` (the work directories, each
attempt's stderr, ``kills.json``: when each kill came and what the run directory held) and
exits 1; rerun the seed to reproduce it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

print = functools.partial(print, flush=True)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from small_spec import small_spec  # noqa: E402  (the tests' small study, with every stage)

#: The tests' small study (2 layers, 100 documents, arms uniform and cosine) with a measured
#: profile (so probe and measure run), two seeds and a checkpoint every 3 of its 20 steps.
SPEC = small_spec(
    "crash",
    {"steps": 20, "seeds": [0, 1], "checkpoint_interval": 3, "log_interval": 1},
    measure=[{"geometry": {"kind": "spherical"}, "statistic": {"kind": "shift"}}],
    probe={"tokens": 48},
)


def command(spec: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "geospec", "run", str(spec), "--out", str(out)]


def environment(cache: Path) -> dict[str, str]:
    return {**os.environ, "GEOSPEC_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # fmt: skip


def outcome(out: Path) -> dict[str, Any]:
    """What must not depend on the kills: the results, the widths, every model's weights."""
    return {
        "results": json.loads((out / "results.json").read_text()),
        "widths": json.loads((out / "widths.json").read_text())["arms"],
        "weights": {
            str(path.relative_to(out)): path.read_bytes().hex()
            for path in sorted(out.rglob("model.safetensors"))
        },
    }


def temporary_file(since: float, *roots: Path) -> bool:
    """Whether geospec is writing an artifact under ``roots``: a temporary file changed after
    ``since`` (atomic writes go through ``.<name>.<random>.tmp`` beside the file, the token
    cache through a scratch directory ``.<key>.<random>/``)."""
    for root in roots:
        if not root.exists():
            continue
        for path in root.rglob(".*"):
            scratch = path.is_dir() or path.name.endswith(".tmp")
            with contextlib.suppress(OSError):  # renamed or removed meanwhile
                if scratch and not path.name.endswith(".lock") and path.stat().st_mtime > since:
                    return True
    return False


def state_of(out: Path, cache: Path) -> dict[str, Any]:
    """What the run directory holds (the stages recorded done, the metric lines of each
    training directory, each checkpoint's time) and whether the token cache is built; all but
    the metric lines (which a resumed run writes again) is durable progress."""
    try:
        stages = sorted(json.loads((out / "stages.json").read_text()))
    except (OSError, ValueError):
        stages = []
    steps = {}
    for path in sorted(out.rglob("metrics.jsonl")):
        steps[str(path.parent.relative_to(out))] = len(path.read_text().splitlines())
    checkpoints = {
        str(path.relative_to(out)): path.stat().st_mtime_ns  # a new one, a new time
        for path in sorted(out.rglob("trainer_state.pt"))
    }
    tokens = sorted(p.parent.name for p in cache.rglob("meta.json"))
    return {"stages": stages, "metric lines": steps, "checkpoints": checkpoints, "tokens": tokens}


def newest_change(*roots: Path) -> float:
    """The latest modification time of anything under ``roots`` (0 when there is nothing)."""
    latest = 0.0
    for root in roots:
        if root.exists():
            for path in root.rglob("*"):
                with contextlib.suppress(OSError):  # removed meanwhile
                    latest = max(latest, path.stat().st_mtime)
    return latest


def attempt(
    spec: Path, out: Path, cache: Path, log: Path, rng: random.Random, share: float, on_write: bool
) -> dict[str, Any]:
    """Start the pipeline and, once it has begun to write, SIGKILL it (and its process group)
    at a random instant: after a delay drawn from [0, 2 x share] (``share``: an equal share of
    the work), or (``on_write``) at the first temporary file seen after half that delay."""
    delay = rng.uniform(0.0, 2 * share)
    started = time.time()
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            command(spec, out), env=environment(cache), stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True,
        )  # fmt: skip
        how, began = "delay", None
        while process.poll() is None:
            now = time.time()
            if began is None:  # start-up (the imports) writes nothing: wait for the first write
                began = now if newest_change(out, cache) > started else None
            elif now - began >= delay:
                break
            elif on_write and now - began >= delay / 2 and temporary_file(started, out, cache):
                how = "while writing"
                break
            time.sleep(0.002 if began is not None and on_write else 0.02)
        finished = process.poll() is not None
        if not finished:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return {
        "killed": not finished,
        "how": how if not finished else "finished first",
        "after_s": round(time.time() - started, 3),
        "returncode": process.returncode,
        "state": state_of(out, cache),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="the kills' random instants")
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs before the final run")
    parser.add_argument("--keep", action="store_true", help="keep the work directory on success")
    parser.add_argument(
        "--failures", type=Path, default=Path("crash-failures"), help="where a failure is kept"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix=f"geospec-crash-{args.seed}-"))
    spec = work / "spec.toml"
    spec.write_text(SPEC)
    clock = time.monotonic()
    straight, straight_cache = work / "straight", work / "straight-cache"
    started = time.time()
    process = subprocess.Popen(
        command(spec, straight), env=environment(straight_cache), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    began = None
    while process.poll() is None:
        if began is None and newest_change(straight, straight_cache) > started:
            began = time.time()
        time.sleep(0.02)
    if process.returncode != 0:
        print(process.stderr.read() if process.stderr else "", file=sys.stderr)
        return _fail(args, work, "the uninterrupted run failed", [])
    work_s = time.time() - (began or started)  # the pipeline's work, without the start-up
    print(f"crash seed {args.seed}: uninterrupted run {time.monotonic() - clock:.1f} s "
          f"({work_s:.1f} s of work); {args.kills} kills follow")  # fmt: skip
    kills: list[dict[str, Any]] = []
    # spread the kills over the whole pipeline: each comes within twice an equal share of the
    # work after the run begins to write (a resumed run also redoes some: the part since the
    # last checkpoint, the start of the stage it was in)
    share, backoff, before, rounds = work_s / args.kills, 1.0, None, 0
    out = cache = work
    while sum(event["killed"] for event in kills) < args.kills:
        if before is None:  # a new round: a fresh run directory and token cache
            rounds += 1
            out, cache = work / f"crashed-{rounds}", work / f"crashed-{rounds}-cache"
            before = {}
        index = len(kills)
        log = work / f"attempt-{index:02d}.stderr"
        event = attempt(spec, out, cache, log, rng, share * backoff, on_write=index % 2 == 1)
        kills.append({"round": rounds, **event})
        print(f"  attempt {index + 1} (round {rounds}): {event['how']} after "
              f"{event['after_s']} s, stages done {event['state']['stages']}")  # fmt: skip
        if not event["killed"]:  # the round's run finished before its kill came
            if event["returncode"] != 0:
                return _fail(args, work, f"attempt {index} failed on its own ({log.name})", kills)
            if outcome(out) != outcome(straight):
                return _fail(args, work, f"round {rounds} differs from the straight run", kills)
            before, backoff = None, 1.0
            continue
        # a kill that left nothing more done than before: the next one waits longer, so every
        # stage is reached however long its first step takes
        durable = {key: value for key, value in event["state"].items() if key != "metric lines"}
        backoff = min(backoff * 1.5, 8.0) if durable == before else max(backoff / 2, 1.0)
        before = durable
    final = subprocess.run(
        command(spec, out), env=environment(cache), capture_output=True, text=True
    )
    (work / "final.stderr").write_text(final.stderr)
    if final.returncode != 0:
        return _fail(args, work, "the final run failed (see final.stderr)", kills)
    if outcome(out) != outcome(straight):
        return _fail(args, work, f"round {rounds} differs from the straight run", kills)
    landed = sum(event["killed"] for event in kills)
    print(f"crash seed {args.seed}: consistent after {landed} kills in {rounds} round(s) "
          f"({time.monotonic() - clock:.0f} s)")  # fmt: skip
    if args.keep:
        (work / "kills.json").write_text(json.dumps(kills, indent=2) + "\n")
        print(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _fail(args: argparse.Namespace, work: Path, why: str, kills: list[dict[str, Any]]) -> int:
    kept = args.failures / f"seed-{args.seed}"
    shutil.rmtree(kept, ignore_errors=True)
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(work), kept)
    (kept / "kills.json").write_text(json.dumps(kills, indent=2) + "\n")
    print(f"crash seed {args.seed}: FAILED: {why}; everything is kept in {kept}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
