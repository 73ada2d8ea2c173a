"""Build the carry kit of the device check: the pure-Python wheels that the project needs on the
lent GPU machine's image and that the image lacks.

    python scripts/build_gpu_kit.py                 # -> .gpu_kit/ (git-ignored), needs PyPI

Run it with the project's own interpreter (``.venv/bin/python``): the versions are the exact
ones installed here (``importlib.metadata``), which are the pins of pyproject.toml.

The kit is the closure of the project's runtime requirements (``[project] dependencies`` of
pyproject.toml, then the ``Requires-Dist`` of each installed requirement, markers evaluated for
Python 3.12 on x86-64 Linux), stopping at any distribution in :data:`IMAGE` (the image has its
own version, which is the one the check runs on) and leaving out :data:`NOT_ON_CHECK_PATHS`.
Each wheel is fetched with ``pip download --no-deps`` (only ``py3-none-any``-style wheels are
accepted: the machine has Python 3.12 and the kit must not depend on this machine's); a
distribution that PyPI
has only as an sdist (antlr4-python3-runtime 4.9.3) is built here with ``pip wheel --no-deps``.
The device-side check (scripts/gpu_check.sh) installs the folder with
``pip install --no-index --no-deps --target``; the device tool carries it (``carry``).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
MAX_MIB = 40  # the device tool carries 64 MiB per call with the working tree; keep room

# The Python distributions on the lent machine's image ('cuda', kind nvidia-h200), copied from
# the "Python packages already there" list of the device tool's KINDS.md (read on a machine
# running the image on 2026-11-17). The check runs on the image's versions of these (python
# 3.12.3, torch 2.11.0+cu130, transformers 5.17.0, tokenizers 0.23.2, safetensors 0.8.0,
# numpy 2.5.2, huggingface_hub 1.33.0, ...), never on carried copies.
_IMAGE_LIST = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp
"""
IMAGE = frozenset(canonicalize_name(n) for n in _IMAGE_LIST.split())

# Runtime requirements the device check never imports, so the kit leaves them (and their
# closures) out: ``datasets`` is imported only by the math tasks' data loading (hub or local
# files; the check trains on the arithmetic task), ``wandb`` only by ``logger=wandb`` and the
# W&B analysis reader, ``reasoning-gym`` only by ``task=reasoning_gym`` (imported when the task
# is built; its closure has compiled wheels such as pycosat). tests/test_gpu_kit.py runs the
# check without them.
NOT_ON_CHECK_PATHS = frozenset({"datasets", "wandb", "reasoning-gym"})

# The image's interpreter and platform, for the requirement markers.
TARGET_MARKERS = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
# pip's selection of wheels for the image (README of the device tool): cp312 on manylinux.
PLATFORM_ARGS = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
    "--platform", "manylinux2014_x86_64", "--platform", "any",
]  # fmt: skip


def _on_image_platform(req: Requirement) -> bool:
    return req.marker is None or req.marker.evaluate({**TARGET_MARKERS, "extra": ""})


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Canonical names of the project's runtime requirements; each must be installed here at
    the version pyproject.toml pins (the kit takes the installed version)."""
    out = []
    for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        req = Requirement(line)
        if not _on_image_platform(req):
            continue
        name = canonicalize_name(req.name)
        here = md.version(name)
        if name not in IMAGE | NOT_ON_CHECK_PATHS and not req.specifier.contains(here):
            raise RuntimeError(f"{name} {here} is installed here, pyproject.toml wants {req}")
        out.append(name)
    return out


def requirements(dist: str) -> list[str]:
    """Canonical names of the installed ``dist``'s requirements on the image (no extras)."""
    reqs = [Requirement(line) for line in md.requires(dist) or []]
    return [canonicalize_name(r.name) for r in reqs if _on_image_platform(r)]


def closure() -> tuple[dict[str, str], dict[str, str]]:
    """(kit: name -> installed version, stopped: name -> why it is not in the kit)."""
    kit: dict[str, str] = {}
    stopped: dict[str, str] = {}
    todo = project_requirements()
    while todo:
        name = todo.pop(0)
        if name in kit or name in stopped:
            continue
        if name in IMAGE:
            stopped[name] = "on the image"
        elif name in NOT_ON_CHECK_PATHS:
            stopped[name] = "not on the check's import paths"
        else:
            kit[name] = md.version(name)
            todo.extend(requirements(name))
    return dict(sorted(kit.items())), dict(sorted(stopped.items()))


def _pip(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)


def fetch(name: str, version: str, dest: Path) -> Path:
    """Download ``name==version`` as a wheel for the image into ``dest`` (built here from the
    sdist when PyPI has no wheel); only pure-Python wheels are accepted."""
    spec = f"{name}=={version}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = _pip("download", "--no-deps", *PLATFORM_ARGS, "-d", tmp, spec)
        if proc.returncode != 0:  # no wheel on PyPI: build one from the sdist
            proc = _pip("wheel", "--no-deps", "-w", tmp, spec)
        if proc.returncode != 0:
            raise RuntimeError(f"pip could not fetch {spec}:\n{proc.stdout}{proc.stderr}")
        (wheel,) = Path(tmp).glob("*.whl")
        if not wheel.name.endswith("-none-any.whl"):
            raise RuntimeError(f"{wheel.name} is not a pure-Python wheel")
        return Path(shutil.copy2(wheel, dest / wheel.name))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / ".gpu_kit"), help="kit folder (emptied first)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    kit, stopped = closure()
    print("not in the kit: " + ", ".join(f"{n} ({why})" for n, why in stopped.items()))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    total = 0
    for name, version in kit.items():
        wheel = fetch(name, version, out)
        total += wheel.stat().st_size
        print(f"  {wheel.name:<64} {wheel.stat().st_size / 2**10:8.0f} KiB")
    mib = total / 2**20
    print(f"{len(kit)} wheels, {mib:.1f} MiB in {out}")
    if mib > MAX_MIB:
        print(f"error: the kit is {mib:.1f} MiB > {MAX_MIB} MiB", file=sys.stderr)
        return 1
    rel = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f'carry: ["{rel}"]')
    print(f"device command (run from the repository root, timeout_s 560): set -o pipefail; "
          f"bash scripts/gpu_check.sh --kit {rel} 2>&1 | tee $OUT/gpu_check.log")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
