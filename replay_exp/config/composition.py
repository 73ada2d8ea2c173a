"""``compose(overrides)``: ``conf/train.yaml`` composed as ``python -m replay_exp.train`` does, and
the ``model=<dir or hub id>`` shorthand of its command line."""

from __future__ import annotations

import os
import re

from omegaconf import DictConfig

from replay_exp.config import naming  # noqa: F401  (registers the run-dir resolvers)
from replay_exp.config.errors import ConfigError
from replay_exp.config.probe import HUB_ID
from replay_exp.config.schemas import CONF_DIR, register_configs


def expand_model_shorthand(overrides: list[str]) -> list[str]:
    """``model=<local dir, hub org/name or gguf:<file>>`` -> ``model=pretrained
    model.pretrained=<it> model.name=<its last part>``; other arguments (and
    ``model=<config name>``) pass unchanged.

    Applied to the command line before Hydra parses it. A value that is neither a config under
    ``conf/model`` nor a directory nor a hub id fails with a one-line :class:`ConfigError`.
    Sweeps over several paths use the long form: ``model=pretrained model.pretrained=a,b``."""
    names = sorted(
        f[:-5] for f in os.listdir(os.path.join(CONF_DIR, "model"))
        if f[-5:] == ".yaml" and not f.startswith("_")
    )  # fmt: skip
    out: list[str] = []
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key != "model" or value in names or "," in value or "(" in value:
            out.append(arg)
            continue
        path = os.path.expanduser(value)
        if value.startswith("gguf:"):  # a GGUF file (replay_exp/models/gguf.py), kept as given
            path = value.rpartition("/")[2].removesuffix(".gguf")
        elif os.path.isdir(path):
            value = os.path.abspath(path)
        elif not HUB_ID.fullmatch(value) or os.path.exists(path):
            raise ConfigError(
                f"model={value} is neither a model config (one of {names}) nor a local model "
                "directory nor a hub id (org/name)"
            )
        label = re.sub(r"[^\w.-]", "_", os.path.basename(path.rstrip("/"))) or "pretrained"
        out += ["model=pretrained", f"model.pretrained='{value}'", f"model.name={label}"]
    return out


def compose(overrides: list[str] | None = None) -> DictConfig:
    """Compose ``conf/train.yaml`` with command-line style ``overrides`` (no run is started).

    The same composition as ``python -m replay_exp.train``; handy in tests and notebooks."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    overrides = expand_model_shorthand(list(overrides or []))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=overrides, return_hydra_config=False)
