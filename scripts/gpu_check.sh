#!/usr/bin/env bash
# The GPU check of generation=vllm (scripts/gpu_check.py: engine start, log-probs vs the trainer,
# RL steps with in-place weight sync, snapshot restore, two 3-step training runs), on one GPU
# with installed wheels only (pip install -e '.[dev,gpu]'; no hub access needed). About 3-6
# minutes on one H200; capped at 8 minutes. Prints PASS/FAIL per check; exit code 1 if any
# failed. Arguments go to gpu_check.py (e.g. --enforce-eager, --skip-train, --json FILE);
# when $OUT is set, the results are also written to $OUT/gpu_check.json.
#   PYTHON=python3   the interpreter with torch, vllm and this project installed
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { echo "gpu_check: $*"; }

if ! "$PY" -c 'import vllm' 2>/dev/null; then
  say "vllm does not import; installing the project with the gpu extra"
  "$PY" -m pip install -q -e '.[dev,gpu]' || { say "FAIL: pip install -e '.[dev,gpu]'"; exit 1; }
elif ! "$PY" -c 'import replay_exp' 2>/dev/null; then
  say "installing the project (editable, no dependencies)"
  "$PY" -m pip install -q --no-deps -e . ||
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . ||
    { say "FAIL: pip install -e ."; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true

args=("$@")
if [ -n "${OUT:-}" ]; then
  args+=(--json "$OUT/gpu_check.json")
fi
timeout --signal=TERM --kill-after=20 480 "$PY" scripts/gpu_check.py "${args[@]}"
rc=$?
if [ "$rc" -eq 124 ]; then
  say "FAIL: timed out after 480 s"
fi
exit "$rc"
