"""The update's loss looked up by algo.name (grpo | asymre) and the algo checks of resolve()."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from replay_exp.algo import asymre_loss, grpo_loss
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.config.schemas import build_node
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.types import RolloutBatch
from replay_exp.update import policy_logprobs, policy_update

# ---------------------------------------------------------------- resolve()

BAD_ALGO = [
    (
        ["algo.name=ppo"],
        "algo.name=ppo is unknown; choose one of "
        "['asymre', 'cispo', 'dppo', 'gmpo', 'grpo', 'gspo', 'm2po', 'sapo', 'topr']",
    ),
    (
        ["algo.mask=tis"],
        "algo.mask=tis is unknown; choose one of "
        "['none', 'icepop', 'seq_mis', 'geometric', 'opsm']",
    ),
    (
        ["algo=cispo", "algo.mask_low=1.5"],
        "algo.mask_low=1.5, algo.mask_high=5.0: need 0 < mask_low <= 1 <= mask_high (an "
        "on-policy token, r = 1, is always kept)",
    ),
    (["algo=gspo", "algo.mask_geo_delta=0"], "algo.mask_geo_delta=0.0 must be in (0, 1)"),
    (["algo.mask_opsm_delta=-1"], "algo.mask_opsm_delta=-1.0 must be >= 0"),
    (
        ["algo.proximal=exact"],
        "algo.proximal=exact is unknown; choose one of ['none', 'recompute', 'loglinear']",
    ),
    (["algo=cispo", "algo.eps_low=1.5"], "algo.eps_low=1.5 must be in [0, 1] for algo=cispo"),
    (["algo=gspo", "algo.eps_low=1.0"], "algo.eps_low=1.0 must be in [0, 1)"),
    (
        ["algo=m2po", "algo.m2_threshold=0"],
        "algo.m2_threshold=0.0 must be > 0 (the budget on mean (log r)^2)",
    ),
    (["algo=topr", "algo.topr_baseline=inf"], "algo.topr_baseline=inf must be finite"),
    (["algo.tis_cap=0"], "algo.tis_cap=0.0 must be > 0 (or null for no truncated IS)"),
    (["algo.tis_cap=-1.5"], "algo.tis_cap=-1.5 must be > 0 (or null for no truncated IS)"),
    (
        ["algo.tis_level=seq"],
        "algo.tis_level=seq is unknown; choose one of ['geometric', 'sequence', 'token']",
    ),
    (
        ["algo.tis_form=double"],
        "algo.tis_form=double is unknown; choose one of ['truncated_is', 'ratio_reweight']",
    ),
    (
        ["algo.tis_cap=2", "algo.tis_form=ratio_reweight", "algo.proximal=loglinear"],
        "algo.tis_form=ratio_reweight weights the ratio against mu, which "
        "algo.proximal=loglinear replaces; use algo.tis_form=truncated_is",
    ),
    (["algo.clip_ratio_c=1"], "algo.clip_ratio_c=1.0 must be > 1 (or null for no dual clip)"),
    (
        ["algo=gspo", "algo.clip_ratio_c=0.5"],
        "algo.clip_ratio_c=0.5 must be > 1 (or null for no dual clip)",
    ),
    (
        ["algo.adv_std=ddof1"],
        "algo.adv_std=ddof1 is unknown; choose one of ['population', 'sample']",
    ),
    (["algo.adv_eps=0"], "algo.adv_eps=0.0 must be > 0 (an all-equal group's std is 0)"),
    (
        ["algo=asymre", "algo.adv_normalize_std=true"],
        "algo.name=asymre needs algo.adv_normalize_std=false (V_hat = r - advantage)",
    ),
    (["algo=asymre", "algo.asymre_dv=nan"], "algo.asymre_dv=nan must be finite"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_ALGO, ids=[" ".join(o) for o, _ in BAD_ALGO])
def test_bad_algo_config(overrides, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve(compose([*overrides, f"output_root={tmp_path / 'runs'}"]))
    assert str(err.value) == message


@pytest.mark.parametrize(
    "overrides",
    [
        ["algo=asymre"],
        ["algo=asymre", "algo.kl_coef=0.05", "algo.asymre_dv=0"],  # KL allowed with AsymRE
        ["algo.tis_cap=2", "algo.tis_level=sequence"],
        ["algo.tis_cap=1.5"],
        ["algo.tis_cap=1.5", "algo.tis_form=ratio_reweight", "algo.tis_level=geometric"],
        ["algo.clip_ratio_c=3", "algo.proximal=recompute"],
        ["algo=gspo", "algo.clip_ratio_c=3"],
        ["algo.adv_std=sample", "algo.adv_eps=1e-4"],
        ["algo=cispo", "algo.mask=icepop"],
        ["algo=gspo", "algo.mask=seq_mis"],
        ["algo.mask=geometric", "algo.proximal=loglinear", "algo.tis_cap=2"],
        ["algo.mask=opsm", "algo.proximal=recompute"],
        ["algo=m2po", "algo.m2_threshold=0.1"],
        ["algo=topr", "algo.topr_baseline=0"],
    ],
)
def test_good_algo_config(overrides):
    cfg, _ = resolve(compose(overrides))
    assert cfg.algo.name in ("asymre", "cispo", "grpo", "gspo", "m2po", "topr")


def test_asymre_and_grpo_share_their_base_and_own_their_knobs():
    from hydra.errors import ConfigCompositionException

    a = resolve(compose(["algo=asymre"]))[0].algo
    g = resolve(compose([]))[0].algo
    assert (a.name, a.adv_normalize_std, a.asymre_dv) == ("asymre", False, -0.1)
    assert g.tis_cap is None and g.tis_level == "token"
    shared = set(a) & set(g)
    assert {k for k in shared if g[k] != a[k]} == {"name", "adv_normalize_std"}
    masks = {"mask", "mask_low", "mask_high", "mask_geo_delta", "mask_opsm_delta"}
    assert set(a) - shared == {"asymre_dv"}
    assert set(g) - shared == {"tis_cap", "tis_level", "tis_form", "proximal", "clip_ratio_c",
                               *masks}  # fmt: skip
    with pytest.raises(ConfigCompositionException, match="tis_cap"):
        compose(["algo=asymre", "algo.tis_cap=2"])  # no importance ratio, so no TIS
    # Each correction owns its knobs: a mask on a loss it does not apply to is refused.
    for option, key in [("m2po", "mask"), ("topr", "mask"), ("cispo", "proximal"),
                        ("asymre", "mask"), ("grpo", "m2_threshold")]:  # fmt: skip
        with pytest.raises(ConfigCompositionException, match=key):
            compose([f"algo={option}", f"algo.{key}=none"])
    for option, own in [("cispo", masks), ("gspo", {*masks, "clip_ratio_c"}),
                        ("m2po", {"m2_threshold"}), ("topr", {"topr_baseline"})]:  # fmt: skip
        c = resolve(compose([f"algo={option}"]))[0].algo
        assert set(c) - set(a) == own and c.name == option


# ---------------------------------------------------------------- update dispatch


class _TinyLM(torch.nn.Module):
    """Embedding -> linear head; enough for policy_logprobs (returns ``.logits``)."""

    def __init__(self, vocab: int = 5, dim: int = 4):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return SimpleNamespace(logits=self.head(self.emb(input_ids)))


def _batch(behaviour_shift: float = 0.0) -> RolloutBatch:
    # 2 prompts x G=2; rewards [1, 0 | 1, 1] -> unnormalised A [0.5, -0.5 | 0, 0]
    return rollout_batch(
        [[0, 1], [0, 1], [2, 3], [2, 3]],
        [[4, 2, 0], [3, 0, 0], [1, 1, 4], [2, 4, 0]],
        completion_mask_BxC=torch.tensor(
            [[True, True, False], [True, False, False], [True, True, True], [True, True, False]]
        ),
        behaviour_logp_BxC=torch.full((4, 3), -1.6 + behaviour_shift),
        reward=[1.0, 0.0, 1.0, 1.0],
        advantage=[0.5, -0.5, 0.0, 0.0],
        group=[0, 0, 1, 1],
    )


def _algo(name: str = "grpo", **kw):
    """The node of ``algo=<name>`` with its YAML's defaults, unnormalised advantages, no grad
    clip, and ``kw``: exactly the loss's schema keys."""
    base = dict(eps_low=0.2, eps_high=0.2, adv_normalize_std=False, grad_clip=None)
    return build_node("algo", name, name=name, **{**base, **kw})


def _step(algo, batch):
    model = _TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stats = policy_update(model, opt, batch, algo, temperature=1.0, norm_len=3)
    return model, stats


def test_update_dispatches_to_asymre_with_baseline_r_minus_a():
    # V_hat = r - A = [0.5, 0.5, 1, 1]: the same step as calling asymre_loss by hand.
    batch = _batch()
    model, stats = _step(_algo(name="asymre"), batch)
    ref = _TinyLM()
    logp, _ = policy_logprobs(ref, batch)
    loss, expect = asymre_loss(
        logp, batch.reward_B, torch.tensor([0.5, 0.5, 1.0, 1.0]), batch.completion_mask_BxC,
        dv=-0.1, behaviour_logp_BxC=batch.behaviour_logp_BxC,
    )  # fmt: skip
    loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    for key in ("pg_loss", "coef_mean", "coef_pos_frac", "ratio_mean", "approx_kl"):
        assert stats[key] == pytest.approx(expect[key])
    for key in ("loss", "grad_norm", "entropy", "batch_size", "tokens"):
        assert key in stats
    assert "clip_frac" not in stats
    # no dependence on behaviour log-probs: the step is bitwise the same from stale rollouts
    stale, stale_stats = _step(_algo(name="asymre"), _batch(behaviour_shift=-2.0))
    for p, q in zip(model.parameters(), stale.parameters(), strict=True):
        assert torch.equal(p, q)
    assert stale_stats["ratio_mean"] != stats["ratio_mean"]


def test_update_grpo_passes_tis_and_rejects_an_unknown_loss():
    batch = _batch(behaviour_shift=0.3)
    _, plain = _step(_algo(), batch)
    _, tis = _step(_algo(tis_cap=1.0, tis_level="sequence"), batch)
    assert "tis_weight_mean" not in plain and "clip_frac" in plain
    assert tis["tis_weight_max"] <= 1.0 and tis["pg_loss"] != plain["pg_loss"]
    ref = _TinyLM()
    logp, _ = policy_logprobs(ref, batch)
    _, expect = grpo_loss(
        logp, batch.behaviour_logp_BxC, batch.advantage_B, batch.completion_mask_BxC,
        tis_cap=1.0, tis_level="sequence",
    )  # fmt: skip
    assert tis["tis_weight_mean"] == pytest.approx(expect["tis_weight_mean"])
    # Names and the AsymRE / normalisation rule are validated once, by resolve()
    # (test_bad_algo_config); a name that reaches the update unvalidated is a KeyError.
    with pytest.raises(KeyError, match="no such loss"):
        _step(SimpleNamespace(**{**vars(_algo()), "name": "ppo"}), batch)
