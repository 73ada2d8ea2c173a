"""The loss registry: a loss lives in three places (its module with ``register_loss``, its
schema, its YAML), the update looks it up by ``algo.name`` with its typed knobs, and a knob the
schema does not have fails loudly: at compose time, at resolve time, or in the update."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from replay_exp.algo import LOSSES, LossInputs, aggregate, loss_knobs, register_loss
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.config.schemas import CONF_DIR, OPTION_SCHEMAS, AlgoConfig, GrpoConfig
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.runlog import read_metrics
from replay_exp.train import run
from replay_exp.update import policy_update

# ---------------------------------------------------------------- a toy loss, in three places


@dataclass
class ToyConfig(AlgoConfig):
    """``algo=toy``: REINFORCE on the frozen advantage, scaled (1. its schema)."""

    toy_scale: float = MISSING  # the scale s of -s * A * log pi


def toy_loss(logp_BxC, advantage_B, mask_BxC, *, scale, agg, norm_len, kl_coef, ref_logp_BxC,
             denom):  # fmt: skip
    """The smallest pure loss: ``-aggregate(scale * A * log pi)`` (no ratio, no KL term)."""
    mask_BxC = mask_BxC.bool()
    logp_BxC = torch.where(mask_BxC, logp_BxC, 0.0)
    objective_BxC = scale * advantage_B.unsqueeze(1) * logp_BxC
    pg_loss = -aggregate(objective_BxC, mask_BxC, agg, norm_len, denom)
    return pg_loss, {"pg_loss": float(pg_loss.detach())}


def check_toy(algo: ToyConfig) -> str | None:
    return None if algo.toy_scale > 0 else f"algo.toy_scale={algo.toy_scale} must be > 0"


def algo_toy(x: LossInputs, algo: ToyConfig):
    """2. its module: the registered call of the pure loss with the typed knobs."""
    return toy_loss(x.logp_BxC, x.advantage_B, x.mask_BxC, scale=algo.toy_scale, **x.common())


# 3. its YAML, here stored in Hydra's ConfigStore instead of conf/algo/toy.yaml.
TOY_YAML = {"defaults": ["toy_schema", "_base", "_self_"], "name": "toy",
            "adv_normalize_std": False, "toy_scale": 2.0}  # fmt: skip


@pytest.fixture
def toy(monkeypatch):
    """Register ``algo=toy`` for one test: schema, YAML, loss; all removed afterwards."""
    monkeypatch.setitem(OPTION_SCHEMAS["algo"], "toy", ToyConfig)
    ConfigStore.instance().store(group="algo", name="toy", node=TOY_YAML)
    register_loss("toy", schema=ToyConfig, check=check_toy)(algo_toy)
    yield
    LOSSES.pop("toy")
    for entry in ("toy.yaml", "toy_schema.yaml"):
        ConfigStore.instance().repo["algo"].pop(entry, None)


class _Table(torch.nn.Module):
    """Logits theta (V = 4) at every position, whatever the input: log pi(v) = log_softmax(
    theta)_v, so the gradient can be derived by hand."""

    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(4))

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return SimpleNamespace(logits=self.theta.expand(*input_ids.shape, 4))


def _batch():
    # Valid tokens: row 0 [1, 2] (A = +0.5), row 1 [1] (A = -0.5), rows 2 and 3 (A = 0): 8.
    return rollout_batch(
        [[0, 1]] * 4,
        [[1, 2, 0], [1, 0, 0], [0, 3, 3], [2, 0, 0]],
        completion_mask_BxC=torch.tensor(
            [[True, True, False], [True, False, False], [True, True, True], [True, True, False]]
        ),
        reward=[1.0, 0.0, 1.0, 1.0],
        advantage=[0.5, -0.5, 0.0, 0.0],
        group=[0, 0, 1, 1],
    )


def test_a_registered_toy_loss_composes_resolves_and_updates_by_hand(toy):
    cfg, _ = resolve(compose(["algo=toy"]))
    assert cfg.algo.name == "toy" and cfg.algo.toy_scale == 2.0 and cfg.algo.grad_clip == 1.0
    assert isinstance(loss_knobs(cfg.algo), ToyConfig)
    model = _Table()
    stats = policy_update(model, torch.optim.SGD(model.parameters(), lr=1.0), _batch(),
                          cfg.algo, temperature=1.0, norm_len=3)  # fmt: skip
    # theta = 0: log pi = -ln 4 for every token. token_mean over the 8 valid tokens, s = 2:
    # pg = -(2/8) sum_{i,t} A_i log pi = -(1/4) (0.5 * 2 - 0.5 * 1) (-ln 4) = ln 4 / 8.
    assert stats["pg_loss"] == pytest.approx(math.log(4) / 8)
    assert stats["loss"] == pytest.approx(math.log(4) / 8)
    # d log pi(y) / d theta_v = 1[y = v] - 1/4, so grad_v = -(1/4) (c_v - 0.5 / 4) with
    # c_v = sum A_i 1[y = v] = [0, 0.5 - 0.5, 0.5, 0]: grad = [1, 1, -3, 1] / 32, norm
    # sqrt(12) / 32 (under the clip of 1); SGD at lr 1 leaves theta = -grad.
    assert stats["grad_norm"] == pytest.approx(math.sqrt(12) / 32)
    torch.testing.assert_close(model.theta.detach(), torch.tensor([-1.0, -1.0, 3.0, -1.0]) / 32)
    assert stats["tokens"] == 8 and stats["entropy"] == pytest.approx(math.log(4))
    assert "masked_frac" not in stats and stats["extra_forwards"] == 0


def test_a_registered_toy_loss_trains_in_the_loop(toy, fast, tmp_path):
    cfg, derived = resolve(compose([*fast, "algo=toy", "schedule.max_steps=1", "eval.every=1",
                                    f"run_dir={tmp_path / 'run'}"]))  # fmt: skip
    summary = run(cfg, derived, tmp_path / "run")
    assert summary["status"] == "finished"
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss/loss" in r]
    assert len(rows) == 1 and math.isfinite(rows[0]["loss/pg_loss"])


def test_the_toy_loss_checks_its_own_knobs_at_resolve(toy):
    with pytest.raises(ConfigError) as err:
        resolve(compose(["algo=toy", "algo.toy_scale=-1"]))
    assert str(err.value) == "algo.toy_scale=-1.0 must be > 0"


# ---------------------------------------------------------------- a misspelt knob fails loudly


def test_a_misspelt_knob_fails_at_compose_time(toy):
    from hydra.errors import ConfigCompositionException

    for overrides in (["algo.tis_capp=2"], ["algo=toy", "algo.toy_scal=1"]):
        with pytest.raises(ConfigCompositionException, match=overrides[-1].split("=")[0]):
            compose(overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["++algo.tis_capp=2"], "algo=grpo has no key algo.tis_capp (did you mean algo.tis_cap?)"),
        (["algo=toy", "++algo.toy_scal=1"],
         "algo=toy has no key algo.toy_scal (did you mean algo.toy_scale?)"),
        (["algo=asymre", "++algo.zzz=1"], "algo=asymre has no key algo.zzz"),
    ],
)  # fmt: skip
def test_a_forced_misspelt_knob_fails_at_resolve_time(toy, overrides, message):
    """``++key=value`` composes a key the schema does not have; resolve() names it."""
    with pytest.raises(ConfigError) as err:
        resolve(compose(overrides))
    assert str(err.value) == message


def test_a_misspelt_knob_in_a_saved_config_fails_at_resolve_time():
    """A config read back from YAML has no schema: a renamed knob is an extra and a lack."""
    plain = OmegaConf.to_container(compose([]))
    plain["algo"]["tis_capp"] = plain["algo"].pop("tis_cap")
    with pytest.raises(ConfigError) as err:
        resolve(OmegaConf.create(plain))
    assert str(err.value) == (
        "algo=grpo has no key algo.tis_capp (did you mean algo.tis_cap?) and lacks algo.tis_cap"
    )


def test_the_update_takes_exactly_the_schema_keys():
    """No silent defaults: a knob the loss's schema does not have, or lacks, is an error."""
    knobs = vars(loss_knobs(compose([]).algo))
    model = _Table()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with pytest.raises(ValueError, match=r"algo=grpo \(GrpoConfig\): no key algo.tis_capp"):
        policy_update(model, opt, _batch(), SimpleNamespace(**knobs, tis_capp=2.0), 1.0, 3)
    lacking = {k: v for k, v in knobs.items() if k != "proximal"}
    with pytest.raises(ValueError, match=r"missing algo.proximal"):
        policy_update(model, opt, _batch(), lacking, 1.0, 3)
    assert isinstance(loss_knobs(knobs), GrpoConfig)


# ---------------------------------------------------------------- the registry itself


def test_every_loss_has_its_schema_and_its_yaml():
    yamls = {p.stem for p in (CONF_DIR / "algo").glob("*.yaml") if not p.stem.startswith("_")}
    assert sorted(LOSSES) == sorted(OPTION_SCHEMAS["algo"]) == sorted(yamls)
    for name, spec in LOSSES.items():
        assert spec.schema is OPTION_SCHEMAS["algo"][name] and spec.loss.__doc__, name
        assert OmegaConf.load(Path(CONF_DIR, "algo", f"{name}.yaml")).name == name


def test_register_loss_refuses_an_unlisted_schema_and_a_second_registration():
    with pytest.raises(ValueError, match="list it in replay_exp/config/schemas.py"):
        register_loss("toy", schema=ToyConfig)
    with pytest.raises(ValueError, match="registered twice"):
        register_loss("grpo", schema=GrpoConfig)(algo_toy)
