"""Run one test again and again, keeping the whole output of every failure: how a rare failure
(a flake) is caught with what it said, instead of being seen once and lost.

    python scripts/repeat_test.py --times 30 \
        "tests/test_train.py::test_a_killed_torchrun_run_resumes_under_torchrun_to_the_same_result"

Each run is a fresh ``python -m pytest NODE -m ""`` (slow tests included) in its own process;
a failing run's output is kept as ``<keep>/run-<i>.log`` (default ``repeat-failures/``), a
passing run's is dropped. Prints one line per run and the count at the end; exits 1 when any
run failed. Run it beside other work when the failure was seen under load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("node", help="a pytest node id")
    parser.add_argument("--times", type=int, default=20)
    parser.add_argument("--keep", type=Path, default=Path("repeat-failures"))
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    failed = 0
    for i in range(args.times):
        start = time.monotonic()
        command = [
            sys.executable,
            "-m",
            "pytest",
            args.node,
            "-m",
            "",
            "-q",
            "-p",
            "no:cacheprovider",
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        seconds = time.monotonic() - start
        if done.returncode == 0:
            print(f"run {i}: passed ({seconds:.0f} s)", flush=True)
            continue
        failed += 1
        args.keep.mkdir(parents=True, exist_ok=True)
        log = args.keep / f"run-{i}.log"
        log.write_text(
            f"$ {' '.join(command)}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
        print(f"run {i}: FAILED ({seconds:.0f} s), output kept in {log}", flush=True)
    print(f"{failed} of {args.times} runs failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
