#!/usr/bin/env bash
# One-shot cuda-mode run of the validation cohort on one CUDA GPU (about ten minutes).
#
#   bash benchmarks/validation/gpu_cohort.sh
#
# Measures the cases cohort-v1.json marks cuda_subset: each in its own process, three training steps through
# recipes/probe.py's probe() (torch.cuda.max_memory_allocated / max_memory_reserved, the process total from NVML),
# random weights built from each model's config on the GPU (nothing is downloaded). Writes
# cuda-cohort-v1.jsonl, summary.json and validation.md under $OUT when it is set, else under
# benchmarks/validation/results/ (then `python benchmarks/validation/analyze.py` rewrites docs/validation.md).
# Installs nothing but the repository itself with its train/probe extras, and only if they are not importable.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
DEST=${OUT:-benchmarks/validation/results}
BUDGET=${CUDA_BUDGET_S:-450}   # start no case after this; each case also has its own timeout
mkdir -p "$DEST"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null | tee "$DEST/gpu.txt" || true
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_cohort.sh: torch sees no CUDA GPU here; nothing was measured" >&2
  exit 2
fi
if ! "$PY" -c "import canifinetune.recipes.probe, trl, peft, bitsandbytes, datasets, accelerate" 2>/dev/null; then
  "$PY" -m pip install -q -e ".[train,probe]" || { echo "gpu_cohort.sh: cannot install the train extra" >&2; exit 2; }
fi
"$PY" -c "import pynvml" 2>/dev/null || echo "note: nvidia-ml-py missing; process totals fall back to mem_get_info (an upper bound)" >&2

"$PY" benchmarks/validation/run_cohort.py --mode cuda --subset cuda --timeout 150 --budget-s "$BUDGET" \
  --out "$DEST/cuda-cohort-v1.jsonl"
status=$?
"$PY" benchmarks/validation/analyze.py --cuda "$DEST/cuda-cohort-v1.jsonl" --summary "$DEST/summary.json" \
  --doc "$DEST/validation.md"
exit $status
