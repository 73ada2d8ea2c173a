"""Run and sweep directory names: the Hydra resolvers ``default_run_dir`` and
``sweep_dir_name`` of ``conf/train.yaml``, registered when this module is imported."""

from __future__ import annotations

import hashlib
import os
import re
from datetime import datetime, timedelta

from omegaconf import OmegaConf

from replay_exp.runlog import in_multirun

_last_stamp: list[datetime] = []  # the newest stamp handed out in this process


def unique_stamp() -> str:
    """``<date>_<time>.<microseconds>-<pid>``: unique per call, in this process (strictly
    increasing microseconds) and across processes (the pid)."""
    now = datetime.now()
    if _last_stamp and now <= _last_stamp[0]:
        now = _last_stamp[0] + timedelta(microseconds=1)
    _last_stamp[:] = [now]
    return f"{now:%Y-%m-%d_%H-%M-%S}.{now:%f}-{os.getpid()}"


def default_run_dir(output_root: str, sweep_name: str | None, seed: int) -> str:
    """The run directory when ``run_dir`` is not given.

    - A single run: ``<output_root>/<date>_<time>.<microseconds>-<pid>``, a new name for every
      composed config (so two runs started in the same second, or twice from one notebook,
      never share a directory; a run also locks its directory, ``replay_exp.rundir``). The
      resolver caches its value per config object, so one config names one directory.
    - A job of a Hydra multirun: ``<output_root>/<sweep_name or "multirun">/<overrides>``,
      named by the job's overrides (sorted, cosmetic keys excluded, see train.yaml's
      ``hydra.job.config.override_dirname``) plus the seed, so a sweep's folder explains itself
      and relaunching a sweep finds its runs again: finished ones are skipped, unfinished ones
      resume from their last snapshot.
    """
    from hydra.core.hydra_config import HydraConfig

    if not in_multirun():
        return f"{output_root}/{unique_stamp()}"
    name = HydraConfig.get().job.override_dirname
    if not re.search(r"(^|,)seed=", name):
        name = f"{name},seed={seed}" if name else f"seed={seed}"
    name = re.sub(r"[^\w.,=+@:-]", "_", name)  # no path separators or spaces in a name
    if len(name) > 160:  # file names have a 255-byte limit: keep a readable head + a hash
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        name = f"{name[:120]}..{digest}"
    return f"{output_root}/{sweep_dir_name(sweep_name)}/{name}"


def sweep_dir_name(sweep_name: str | None) -> str:
    """Folder of a multirun's runs under output_root: the sweep's name, or ``multirun``."""
    return sweep_name or "multirun"


if not OmegaConf.has_resolver("default_run_dir"):
    OmegaConf.register_new_resolver("default_run_dir", default_run_dir, use_cache=True)
if not OmegaConf.has_resolver("sweep_dir_name"):
    OmegaConf.register_new_resolver("sweep_dir_name", sweep_dir_name)


# ---------------------------------------------------------------------------------------------
# resolve(): derive once, validate loudly.
# ---------------------------------------------------------------------------------------------
