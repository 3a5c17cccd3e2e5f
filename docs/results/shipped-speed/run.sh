#!/usr/bin/env bash
# docs/results/shipped-speed: how it was run (from a worktree at the commit that added this file,
# llama-cpp-python 0.3.36 built from its sdist as `nox -s llamacpp` builds it, nothing else
# running). FILES: where the exported GGUF files go (outside the repository: model weights).
set -euo pipefail
FILES=${FILES:?a directory for the exported GGUF files}
RESULTS=docs/results/shipped-speed
CACHE=~/.cache/geospec-test
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
mkdir -p "$FILES"

prune_and_export() {  # SPEC NAME: prune, then export every unit the spec keeps a model of
  local spec=$1 name=$2
  /usr/bin/time -f "$name prune: %e s wall, %M KiB peak" \
    geospec prune "specs/$spec.toml" --threads 2 >"$RESULTS/prune-$name.log" 2>&1
  tail -1 "$RESULTS/prune-$name.log"
  cp "runs/shipped-speed-$name/prune.json" "$RESULTS/prune-$name.json"
  cp "runs/shipped-speed-$name/prune/report.md" "$RESULTS/report-$name.md"
  for unit in runs/shipped-speed-"$name"/prune/keep-*/*/seed-0; do
    [ -d "$unit/model" ] || continue
    local keep arm
    keep=$(basename "$(dirname "$(dirname "$unit")")") arm=$(basename "$(dirname "$unit")")
    # a file already there was written whole (exports are atomic) by an earlier try: kept
    [ -e "$FILES/$name-$keep-$arm.gguf" ] ||
      /usr/bin/time -f "  $name $keep $arm export: %e s wall, %M KiB peak" \
        geospec export "$unit" --format gguf --to "$FILES/$name-$keep-$arm.gguf" \
        2>&1 | tee -a "$RESULTS/exports.log"
    rm -rf "$unit/model"  # float32 weights of 0.5-1.5B models: the disk holds one run's at a time
  done
}

time_files() {  # NAME SOURCE: every exported file of NAME against its source, 5 rounds
  local name=$1 source=$2
  local files=("unpruned=$source")
  for f in "$FILES/$name"-keep-*.gguf; do files+=("$(basename "$f" .gguf)=$f"); done
  python benchmarks/pruned_runtime.py --threads 2 --prompt 128 --generate 32 --repeats 5 \
    --files "${files[@]}" | tee "$RESULTS/runtime-$name.md"
}

prune_and_export shipped-speed-smollm2-135m smollm2
time_files smollm2 "$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
prune_and_export shipped-speed-qwen2.5-coder-0.5b qwen05
time_files qwen05 "$CACHE/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
prune_and_export shipped-speed-qwen2.5-coder-1.5b qwen15
prune_and_export shipped-speed-qwen2.5-coder-1.5b-grid64 qwen15-grid64
mv "$FILES/qwen15-grid64-keep-0.75-protect-ends.gguf" "$FILES/qwen15-keep-0.75-protect-ends-grid64.gguf"
time_files qwen15 "$CACHE/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
