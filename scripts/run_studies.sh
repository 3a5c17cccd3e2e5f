#!/usr/bin/env bash
# The studies behind docs/results (issue 16), one after another, on one CPU thread at the lowest
# priority, so the machine stays usable: study-austen, then study-depth12, study-transfer (which
# reads runs/study-austen/profiles.json and shares runs/study-depth12), study-shakespeare.
# Each `geospec run` resumes where it stopped; SIGTERM checkpoints the current run and stops.
#
#     setsid scripts/run_studies.sh [WORKDIR [STUDY...]] &
#
# WORKDIR (default ~/geospec-studies) holds runs/; STUDY names (austen, depth12, transfer,
# shakespeare) pick some of them, in the order given. On a machine with a spare core, start a
# second driver on the same WORKDIR: the two share every study run by run (each arm-seed run is
# claimed by one process; see geospec/locks.py), which halves the wall time.
#
# Logs: WORKDIR/<study>.<driver pid>.log. Run directories: WORKDIR/runs/<study>.
set -u
specs="$(cd "$(dirname "$0")/../specs" && pwd)"
workdir="${1:-$HOME/geospec-studies}"
shift || true
studies=("$@")
[ ${#studies[@]} -gt 0 ] || studies=(austen depth12 transfer shakespeare)
mkdir -p "$workdir" && cd "$workdir" || exit 2
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
for study in "${studies[@]}"; do
    log="$study.$$.log"
    echo "=== start study-$study $(date)" >> "$log"
    nice -n 19 geospec run "$specs/study-$study.toml" >> "$log" 2>&1 < /dev/null
    echo "=== exit $? study-$study $(date)" >> "$log"
done
