#!/usr/bin/env bash
# The GPU check exactly as the device tool runs it (one H200, no network, Python 3.12, torch 2.11):
#
#   here, once:   bash benchmarks/gpu_check.sh --download-wheels   # fills .whl/ (about 2.7 MB)
#   device tool:  run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=560)
#   here, CPU:    nox -s gpu_smoke   # this script with --cpu-smoke, in a virtual environment that
#                                    # holds only the image's packages (wheels for its Python)
#
# It installs the carried wheels (benchmarks/gpu_wheels.txt; from $GEOSPEC_WHEELS, default .whl/)
# and geospec, without dependencies, into a fresh folder on PYTHONPATH, goes offline, and runs
# benchmarks/gpu_check.py within 8 minutes; the figures also go to $OUT/gpu_check.json when the
# device tool's $OUT is set. Further arguments go to gpu_check.py. Then the float32 distance
# bounds are checked on the GPU (a minute at most; pytest is in the image).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PYTHON=${PYTHON:-python3}
LIMIT=480 # seconds: gpu_check.py's share of the device tool's call

if [ "${1:-}" = "--download-wheels" ]; then
    mkdir -p .whl
    grep -v '^#' benchmarks/gpu_wheels.txt | xargs "$PYTHON" -m pip download --no-deps \
        --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl
    ls -l .whl
    exit 0
fi
mode=()
if [ "${1:-}" = "--cpu-smoke" ]; then
    mode=(--cpu-smoke)
    shift
fi

wheels=${GEOSPEC_WHEELS:-.whl}
wanted=$(grep -cv '^#' benchmarks/gpu_wheels.txt)
found=$(find "$wheels" -maxdepth 1 -name '*.whl' 2>/dev/null | wc -l)
if [ "$found" -ne "$wanted" ]; then
    echo "gpu_check.sh: $wheels/ holds $found wheels, benchmarks/gpu_wheels.txt names $wanted;" \
        "run 'bash benchmarks/gpu_check.sh --download-wheels' here and carry .whl" >&2
    exit 2
fi
site=$(mktemp -d /tmp/geospec-site.XXXXXX)
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "$wheels"/*.whl
# geospec itself, without dependencies (the image's setuptools builds it); from the source tree
# if that fails
if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
    --target "$site" . >"$site.log" 2>&1; then
    echo "gpu_check.sh: installing geospec failed ($(tail -n 1 "$site.log"));" \
        "running it from the source tree" >&2
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
if [ ${#mode[@]} -eq 0 ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
fi
json=()
if [ -n "${OUT:-}" ]; then json=(--json "$OUT/gpu_check.json"); fi
status=0
timeout "$LIMIT" "$PYTHON" benchmarks/gpu_check.py "${mode[@]}" "${json[@]}" "$@" || status=$?
# the measure stage's float32 distances on this machine's GPU (the CPU alone under --cpu-smoke)
# within the rounding bounds docs/engine.md derives: the tests run as they do here
echo "distances: float32 on the device against the float64 bounds (tests/test_distances_on_device.py)"
timeout 60 "$PYTHON" -m pytest -q -p no:cacheprovider -k within_the_bound \
    tests/test_distances_on_device.py || status=$?
exit "$status"
