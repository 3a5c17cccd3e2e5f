#!/usr/bin/env bash
# The studies behind docs/results (issue 16), one after another, on one CPU thread at the lowest
# priority, so the machine stays usable: study-austen, then study-depth12, study-transfer (which
# reads runs/study-austen/profiles.json and shares runs/study-depth12), study-shakespeare.
# Each `geospec run` resumes where it stopped; SIGTERM checkpoints the current run and stops.
#
#     setsid scripts/run_studies.sh [WORKDIR] &      # WORKDIR (default ~/geospec-studies) holds runs/
#
# Logs: WORKDIR/<study>.log. Run directories: WORKDIR/runs/<study>.
set -u
specs="$(cd "$(dirname "$0")/../specs" && pwd)"
workdir="${1:-$HOME/geospec-studies}"
mkdir -p "$workdir" && cd "$workdir" || exit 2
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
for study in austen depth12 transfer shakespeare; do
    echo "=== start study-$study $(date)" >> "$study.log"
    nice -n 19 geospec run "$specs/study-$study.toml" >> "$study.log" 2>&1 < /dev/null
    echo "=== exit $? study-$study $(date)" >> "$study.log"
done
