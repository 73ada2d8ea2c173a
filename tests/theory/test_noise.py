"""The theory's measurements (replay_exp.theory.noise) recover planted answers, and the testbed
driver (replay_exp.theory.measure) computes per-rollout gradients that average to the pool-loss
gradient and runs end to end."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from replay_exp.theory.noise import (
    Blocks,
    bootstrap_weights,
    fit_power_law,
    gram,
    noise_variance,
    reuse_correlation,
)

D = 4000  # gradient dimension of the synthetic cases


def grouped_noise(gen, n_groups, group_size, scale, group_share=0.3):
    """Rows = mean + group effect + own noise; trace of the per-row covariance is
    ``scale^2 * D`` (a share ``group_share`` of it from the group effect)."""
    group = torch.randn(n_groups, D, generator=gen) * scale * group_share**0.5
    own = torch.randn(n_groups * group_size, D, generator=gen) * scale * (1 - group_share) ** 0.5
    return group.repeat_interleave(group_size, dim=0) + own


def ids(n_groups, group_size):
    return np.repeat(np.arange(n_groups), group_size).tolist()


def test_noise_variance_recovers_a_planted_trace_despite_a_large_mean_and_group_effects():
    gen = torch.Generator().manual_seed(0)
    mean = torch.full((D,), 3.0)  # ||mean||^2 = 9 D, far above the noise (D)
    g = mean + grouped_noise(gen, 64, 8, 1.0)
    est = noise_variance(Blocks.of(gram(g), ids(64, 8)))
    assert est == pytest.approx(D, rel=0.1)
    # the naive estimator (mean squared norm) is dominated by the mean
    assert float((g**2).sum(1).mean()) > 9 * D


def test_fit_power_law_recovers_a_planted_alpha():
    gen = torch.Generator().manual_seed(1)
    taus = [0, 1, 2, 4, 8, 16, 32, 64]
    alpha = 0.3
    sigma2 = []
    for tau in taus:
        scale = max(tau, 1) ** alpha * (0.5 if tau == 0 else 1.0)
        g = grouped_noise(gen, 32, 8, scale)
        sigma2.append(noise_variance(Blocks.of(gram(g), ids(32, 8))))
    fit, log_c = fit_power_law(taus, sigma2)
    assert fit == pytest.approx(alpha, abs=0.03)
    assert np.exp(2 * log_c) == pytest.approx(D, rel=0.15)


def test_fit_power_law_flat_profile_gives_zero_and_rejects_bad_input():
    assert fit_power_law([1, 2, 4], [5.0, 5.0, 5.0])[0] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="two or more"):
        fit_power_law([0, 1], [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        fit_power_law([1, 2], [1.0, -2.0])


@pytest.mark.parametrize("rho", [0.0, 0.6, 0.95])
def test_reuse_correlation_recovers_a_planted_rho(rho):
    gen = torch.Generator().manual_seed(2)
    a = torch.full((D,), 1.0) + grouped_noise(gen, 48, 8, 1.0)
    fresh = grouped_noise(gen, 48, 8, 1.0)
    # the second use: a different mean (the policy moved), the same noise with weight rho
    b = torch.full((D,), -2.0) + 2.0 * (rho * (a - 1.0) + (1 - rho**2) ** 0.5 * fresh)
    g_ids = ids(48, 8)
    est = reuse_correlation(
        Blocks.of(gram(a, b), g_ids), Blocks.of(gram(a), g_ids), Blocks.of(gram(b), g_ids)
    )
    assert est == pytest.approx(rho, abs=0.06)


def test_reuse_correlation_of_a_rollout_with_itself_is_one():
    g = torch.randn(40, 50, generator=torch.Generator().manual_seed(3))
    blocks = Blocks.of(gram(g), ids(10, 4))
    assert reuse_correlation(blocks, blocks, blocks) == pytest.approx(1.0)


def test_blocks_weights_never_pair_a_group_with_its_own_copy():
    # 3 groups of 1 rollout, scalar "gradients" 1, 2, 4: products are plain multiplications
    g = torch.tensor([[1.0], [2.0], [4.0]])
    b = Blocks.of(gram(g), [0, 1, 2])
    assert b.same() == pytest.approx((1 + 4 + 16) / 3)
    assert b.different() == pytest.approx((2 + 4 + 8) * 2 / 6)
    w = np.array([2.0, 1.0, 0.0])  # group 0 drawn twice, group 2 never
    assert b.same(w) == pytest.approx((2 * 1 + 4) / 3)
    # pairs of different original groups only: (0,1) x 2 copies x 2 orders
    assert b.different(w) == pytest.approx(2.0)
    rng = np.random.default_rng(0)
    draws = np.stack([bootstrap_weights(rng, 5) for _ in range(200)])
    assert (draws.sum(1) == 5).all() and draws.mean() == pytest.approx(1.0, abs=0.1)


def test_blocks_reject_a_single_group_or_mismatched_ids():
    with pytest.raises(ValueError, match="two prompt groups"):
        Blocks.of(np.eye(3), [0, 0, 0])
    with pytest.raises(ValueError, match="one group id per row"):
        Blocks.of(np.eye(3), [0, 1])


def test_per_rollout_grads_average_to_the_pool_loss_gradient(fast):
    from replay_exp.algo import agg_denominator
    from replay_exp.config.composition import compose
    from replay_exp.config.derive import resolve
    from replay_exp.models import load_policy
    from replay_exp.models.forward import policy_logprobs
    from replay_exp.rollout.synthetic import random_rollouts
    from replay_exp.tasks import make_task
    from replay_exp.theory.measure import per_rollout_grads
    from replay_exp.update import batch_loss

    cfg, d = resolve(compose(fast))
    task = make_task(cfg.task)
    policy, _, _ = load_policy(cfg.model, cfg.task, task, "cpu", "float32")
    pool = random_rollouts(8, 2, 0, group_size=4, seed=0)
    vocab = policy.config.vocab_size  # random ids in [100, 1000), folded into the vocabulary
    pool = dataclasses.replace(
        pool,
        prompt_ids_BxP=pool.prompt_ids_BxP % vocab,
        completion_ids_BxC=pool.completion_ids_BxC % vocab,
    )
    rows = per_rollout_grads(policy, pool, cfg.algo, 1.0, d.max_new_tokens)
    params = [p for p in policy.parameters() if p.requires_grad]
    denom = agg_denominator(pool.completion_mask_BxC, cfg.algo.loss_agg, d.max_new_tokens)
    logp, _ = policy_logprobs(policy, pool, 1.0)
    loss, _ = batch_loss(cfg.algo, pool, logp, None, d.max_new_tokens, denom)
    full = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])
    assert rows.shape == (8, full.numel())
    torch.testing.assert_close(rows.mean(0), full, rtol=1e-4, atol=1e-6)
    assert float(full.norm()) > 0


@pytest.mark.slow
def test_measure_noise_cli_end_to_end(fast, tmp_path):
    from replay_exp.theory.measure import load_blocks, main

    out = tmp_path / "noise"
    main(["--seeds", "0", "1", "--at", "4", "6", "--taus", "0", "1", "2", "4", "--deltas", "1",
          "2", "--pool-groups", "6", "--boot", "50", "--out", str(out), *fast])  # fmt: skip
    summary = json.loads((out / "noise.json").read_text())
    assert set(summary["points"]) == {"4", "6"}
    pooled = summary["pooled"]
    assert len(pooled["sigma2"]) == 4 and all(s > 0 for s in pooled["sigma2"])
    lo, hi = pooled["alpha_ci"]
    assert lo <= pooled["alpha"] <= hi
    assert all(-1.5 < r < 1.5 for r in pooled["rho"])
    assert (out / "noise.png").stat().st_size > 0
    lo, hi = pooled["mean2_ci"]
    assert lo <= pooled["mean2"] <= hi
    assert len(pooled["drift2_detect"]) == 4 and all(d > 0 for d in pooled["drift2_detect"][1:])
    blocks = load_blocks(out / "noise_blocks.npz")
    assert set(blocks) == {0, 1} and set(blocks[0]) == {"4", "6"}
    b = blocks[0]["4"]["sigma/0"]
    assert b.S.shape == (6, 6) and b.n.tolist() == [4] * 6
    # the saved blocks reproduce the summary's estimate (the seed mean) exactly
    again = np.mean([noise_variance(blocks[sd]["4"]["sigma/0"]) for sd in (0, 1)])
    assert again == pytest.approx(summary["points"]["4"]["sigma2"][0], rel=1e-12)


def test_detection_limit_is_2_8_bootstrap_standard_errors():
    from replay_exp.theory.measure import detection_limit

    # replicates -1, 1: sd (ddof 1) = sqrt(2); (1.959964 + 0.841621) sqrt(2) = 3.96204
    assert detection_limit(np.array([-1.0, 1.0])) == pytest.approx(3.96204, abs=1e-4)
    # a NaN replicate (degenerate resample) is dropped; constant replicates detect anything
    assert detection_limit(np.array([-1.0, np.nan, 1.0])) == pytest.approx(3.96204, abs=1e-4)
    assert detection_limit(np.array([2.0, 2.0, 2.0])) == 0.0
    assert np.isnan(detection_limit(np.array([1.0])))


def test_saved_blocks_are_compacted_losslessly(tmp_path):
    """save_blocks stores a symmetric Gram matrix as its upper triangle and an array equal to
    one already stored by name; load_blocks gives back every array bit for bit, and still reads
    a file in the older, plain layout."""
    from replay_exp.theory.measure import load_blocks, save_blocks
    from replay_exp.theory.noise import Blocks, CrossBlocks

    rng = np.random.default_rng(0)
    g = rng.normal(size=(5, 7))
    gram = g @ g.T
    gram = np.triu(gram) + np.triu(gram, 1).T  # exactly symmetric, as a pool's Gram blocks are
    cross = rng.normal(size=(5, 5))  # square, not symmetric: stored whole
    n = np.full(5, 8.0)
    blocks = {0: {"4": {"sigma/0": Blocks(S=gram, D=np.diag(gram).copy(), n=n),
                        "cross/0": CrossBlocks(S=gram.copy(), n_a=n.copy(), n_b=n.copy()),
                        "cross/1": CrossBlocks(S=cross, n_a=n.copy(), n_b=n.copy())}}}  # fmt: skip
    path = tmp_path / "noise_blocks.npz"
    save_blocks(path, blocks)
    names = set(np.load(path).files)
    assert "0|4|sigma/0|S|triu" in names and "0|4|cross/1|S" in names
    assert {"0|4|cross/0|S|same", "0|4|cross/0|n_a|same", "0|4|cross/1|n_b|same"} <= names
    # 15 unique values of gram's upper triangle (5 * 6 / 2) instead of 25
    assert np.load(path)["0|4|sigma/0|S|triu"].shape == (15,)

    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()

    def check(got):
        for key, b in blocks[0]["4"].items():
            assert type(got[0]["4"][key]) is type(b)
            for f in b.__dataclass_fields__:
                assert same(getattr(got[0]["4"][key], f), getattr(b, f)), (key, f)

    check(load_blocks(path))
    plain = tmp_path / "plain.npz"  # the layout written before the compaction
    np.savez_compressed(plain, **{f"0|4|{k}|{f}": getattr(b, f) for k, b in blocks[0]["4"].items()
                                  for f in b.__dataclass_fields__})  # fmt: skip
    check(load_blocks(plain))
