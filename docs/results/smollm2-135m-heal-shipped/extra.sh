#!/usr/bin/env bash
# added after the results: the healed model in higher types, scored and timed on quiet cores
set -euo pipefail
cd /work/wt-heal
export PATH=/work/venv-speed/bin:$PATH HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
SPEC=specs/smollm2-135m-heal-shipped.toml
RES=docs/results/smollm2-135m-heal-shipped
F=/work/heal-files
SOURCE=~/.cache/geospec-test/SmolLM2-135M-Instruct.Q4_1.gguf
for t in q5_1 q8_0; do
  geospec heal $SPEC best@0.5 --threads 2 --format gguf --dtype $t --to $F/after-$t.gguf 2>&1 | tail -1
  geospec prune $SPEC --threads 2 --export best@0.5 --format gguf --dtype $t --to $F/before-$t.gguf 2>&1 | grep -v "^✓\|nothing to do" | tail -2
done
unit=runs/smollm2-135m-heal-shipped/prune/keep-0.5/shift-spherical/seed-0
python scripts/shipped_files.py $SPEC --threads 2 --json $RES/shipped-files-types.json \
  --file "before-q5_1=$F/before-q5_1.gguf@$unit/model" --file "before-q8_0=$F/before-q8_0.gguf@$unit/model" \
  --file "after-q5_1=$F/after-q5_1.gguf@$unit/healed/model" --file "after-q8_0=$F/after-q8_0.gguf@$unit/healed/model" \
  > $RES/shipped-files-types.md
python benchmarks/pruned_runtime.py --threads 2 --prompt 128 --generate 32 --repeats 5 \
  --files "unpruned=$SOURCE" "before=$F/before.gguf" "after=$F/after.gguf" "after-q5_1=$F/after-q5_1.gguf" "after-q8_0=$F/after-q8_0.gguf" \
  > $RES/runtime.md
echo extra done
