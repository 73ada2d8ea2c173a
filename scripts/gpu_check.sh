#!/usr/bin/env bash
# The device check on the lent GPU machine's image as it is: `pytest -m gpu
# tests/gpu/test_gpu_check.py`, in this order (issue 43): the mixed-precision check at lr 1e-6
# on a ~100 M Qwen2 (bf16 compute over fp32 master weights moves like fp32), determinism and
# kill + resume with deterministic=true, the async runtime (W = 1, T = 1 sharing the GPU), the
# throughput benchmark at Qwen3-0.6B's shape (bench/throughput.py), then the per-model runs
# (on-policy, FIFO, shared-prompt forward) and the vLLM checks when vllm imports. Capped at
# 6 minutes in all (GPU_CHECK_CAP_S=360): of a session's 15 device minutes that leaves a warm
# rerun after a cold start; a cap that runs out cuts the tail of the list. Exit code 1 if any
# check failed.
#
#   bash scripts/gpu_check.sh [--kit DIR] [--device cuda|cpu] [--steps N] [--skip-vllm]
#                             [--keep DIR] [pytest args, e.g. -k resume]
#
# Stage 0 prints versions and CUDA facts only (seconds: a broken image fails here, cheaply).
# Stage 1 installs the carry kit (scripts/build_gpu_kit.py: the pure-Python wheels the image
# lacks; default DIR .gpu_kit) with `pip install --no-index --no-deps --target` into a temporary
# folder and puts it and this CHECKOUT on PYTHONPATH (the project is never installed), then
# checks that replay_exp imports from outside the checkout. Stage 2 runs the checks (pytest,
# from the image: the kit does not carry it), one test each, PASS / FAIL / SKIP with their
# numbers; when $OUT is set they are written to $OUT/gpu_check.json. The options become the
# GPU_CHECK_* settings of tests/gpu/conftest.py (--device defaults to cuda: no GPU is a FAIL).
#   PYTHON="python3"   the interpreter (words allowed: PYTHON="python3 -S")
#   PIP="python3 -m pip"   what installs the kit (default: $PYTHON -m pip)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
read -ra PY <<<"${PYTHON:-python3}"
# A relative interpreter path (PYTHON=.venv/bin/python) still works after the cd below.
case ${PY[0]} in /*) ;; */*) PY[0]=$PWD/${PY[0]} ;; esac
read -ra PIP_CMD <<<"${PIP:-${PY[*]} -m pip}"
CAP=${GPU_CHECK_CAP_S:-360}
START=$SECONDS
say() { echo "gpu_check: $*"; }
kit=$ROOT/.gpu_kit
device=cuda
pytest_args=()
unset GPU_CHECK_STEPS GPU_CHECK_KEEP GPU_CHECK_SKIP_VLLM
while [ $# -gt 0 ]; do
  case $1 in
    --kit) kit=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --steps) export GPU_CHECK_STEPS=$2; shift 2 ;;
    --skip-vllm) export GPU_CHECK_SKIP_VLLM=1; shift ;;
    --keep) export GPU_CHECK_KEEP=$2; shift 2 ;;
    *) pytest_args+=("$1"); shift ;;
  esac
done
case $kit in /*) ;; *) kit=$ROOT/$kit ;; esac

say "stage 0: versions"
timeout 90 "${PY[@]}" - <<'EOF' || { say "FAIL: stage 0 (python, torch or transformers)"; exit 1; }
import platform, sys
print("python", platform.python_version(), sys.executable)
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    print(f"device {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
          f"{total / 2**30:.1f} GiB ({free / 2**30:.1f} free)")
import transformers
print("transformers", transformers.__version__)
EOF
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm \
  --format=csv,noheader 2>/dev/null || say "nvidia-smi: not available"

say "stage 1: the kit ($kit) and the checkout on PYTHONPATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/site"
shopt -s nullglob
wheels=("$kit"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
  "${PIP_CMD[@]}" install -q --no-index --no-deps --no-compile --no-cache-dir \
    --disable-pip-version-check --target "$work/site" "${wheels[@]}" ||
    { say "FAIL: pip install of the kit"; exit 1; }
  say "installed ${#wheels[@]} wheels: $(cd "$kit" && echo *.whl)"
else
  say "no wheels in $kit: the interpreter's own packages only (build it: scripts/build_gpu_kit.py)"
fi
export PYTHONPATH="$work/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Every model is a local folder; the lent machine reaches no hub (never wait for one).
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
# From outside the checkout: replay_exp must come from PYTHONPATH, hydra from the kit or image,
# pytest from the image.
(cd "$work" && "${PY[@]}" -c 'import hydra, omegaconf, pytest, replay_exp.train as t; print("replay_exp from", t.__file__)') ||
  { say "FAIL: the project does not import with the kit"; exit 1; }

left=$((CAP - (SECONDS - START)))
export GPU_CHECK_DEVICE=$device GPU_CHECK_BUDGET_S=$((left - 25))
if [ -n "${OUT:-}" ]; then
  export GPU_CHECK_JSON=$OUT/gpu_check.json
else
  unset GPU_CHECK_JSON
fi
say "stage 2: checks (${left} s left of ${CAP} s)"
cd "$work" || exit 1
# -p no:cacheprovider and no byte code: nothing is written into the checkout.
PYTHONDONTWRITEBYTECODE=1 timeout --signal=TERM --kill-after=15 "$left" \
  "${PY[@]}" -m pytest -m gpu -v -s -p no:cacheprovider --rootdir "$ROOT" \
  "$ROOT/tests/gpu/test_gpu_check.py" "${pytest_args[@]}"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  say "FAIL: the cap of ${CAP} s was reached"
  rc=1
elif [ "$rc" -ne 0 ] && [ "$rc" -ne 1 ]; then
  say "FAIL: pytest exited with $rc (2: interrupted, 3: internal error, 4: usage, 5: no tests)"
  rc=1
fi
exit "$rc"
