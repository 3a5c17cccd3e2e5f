#!/usr/bin/env bash
# docs/results/smollm2-135m-heal-shipped: how it was run, from a worktree at the commit that added
# this file, llama-cpp-python 0.3.36 installed (built from its sdist as `nox -s llamacpp` builds
# it), nothing else running. FILES: where the GGUF files go (outside the repository: model
# weights). STEPS: which of prune, heal and score to run (all three by default).
set -euo pipefail
FILES=${FILES:?a directory for the GGUF files}
STEPS=${STEPS:-"prune heal score"}
SPEC=specs/smollm2-135m-heal-shipped.toml
RUN=runs/smollm2-135m-heal-shipped
RESULTS=docs/results/smollm2-135m-heal-shipped
SOURCE=~/.cache/geospec-test/SmolLM2-135M-Instruct.Q4_1.gguf
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
mkdir -p "$FILES"

for step in $STEPS; do
  case $step in
  prune)  # the quick start's prune and What to ship, then the recommended model's file
    /usr/bin/time -f "prune and export: %e s wall, %M KiB peak" \
      geospec prune "$SPEC" --threads 2 --export best@0.5 --format gguf \
      --to "$FILES/before.gguf" >"$RESULTS/prune.log" 2>&1
    tail -3 "$RESULTS/prune.log"
    cp "$RUN/prune.json" "$RESULTS/prune.json"
    cp "$RUN/prune/report.md" "$RESULTS/report.md"
    ;;
  heal)  # geospec heal's defaults on the same model, exported the same way
    /usr/bin/time -f "heal and export: %e s wall, %M KiB peak" \
      geospec heal "$SPEC" best@0.5 --threads 2 --format gguf \
      --to "$FILES/after.gguf" >"$RESULTS/heal.log" 2>&1
    tail -3 "$RESULTS/heal.log"
    cp "$RUN"/prune/keep-0.5/*/seed-0/healed/result.json "$RESULTS/healed-result.json"
    ;;
  score)  # the three files in llama.cpp (and the two pruned ones as geospec reads them)
    unit=$(dirname "$(ls -d "$RUN"/prune/keep-0.5/*/seed-0/healed)")
    python scripts/shipped_files.py "$SPEC" --threads 2 --json "$RESULTS/shipped-files.json" \
      --file "unpruned=$SOURCE" \
      --file "before=$FILES/before.gguf@$unit/model" \
      --file "after=$FILES/after.gguf@$unit/healed/model" | tee "$RESULTS/shipped-files.md"
    ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
