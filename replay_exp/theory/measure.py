"""Measure the theory's sigma^2(tau) and rho on the testbed (estimators:
:mod:`replay_exp.theory.noise`).

    python -m replay_exp.theory.measure --seeds 0 1 2 --at 128 512 --out DIR [key=value ...]

Procedure, per seed. The policy trains on-policy (the composed config with
``experiment=on_policy`` plus any overrides: the study's lr, batch and task) for ``max(--at)``
steps, exactly as ``replay_exp.train`` would. Along the way, for every measurement point
``t`` in ``--at``:

* at versions ``t - tau`` (``tau`` in ``--taus``) it also generates a *pool* of
  ``--pool-groups`` prompt groups of G rollouts (its own seeds; never trained on), with their
  behaviour log-probs and advantages frozen as the trainer would freeze them;
* it keeps the parameters of versions ``v .. t`` with ``v = t - max(--deltas)``.

At version ``t`` it computes every pool rollout's gradient (``replay_exp.theory.noise``: the
rollout's
share of the pool's ``algo`` loss, times the pool size) and keeps only Gram matrices:

* ``sigma^2(tau)``: pool ``t - tau`` at ``theta_t``, for each tau;
* ``drift^2(tau)`` and ``error(tau) = sigma^2 + drift^2``: pool ``t - tau`` against the fresh
  pool ``t``, both at ``theta_t``;
* ``rho(delta)``: pool ``v`` at ``theta_v`` and at ``theta_{v + delta}``, for each delta (the
  two uses of a rollout ``delta`` versions apart).

``signal(tau) = <m_tau, m_0> / ||m_0||^2`` is how much of the fresh mean gradient a stale
pool's mean gradient carries (1 at tau = 0; the clip and the ratios shrink it), and
``informative(tau)`` is the share of the pool's prompt groups with a non-zero gradient (not all
rewards equal): an older policy's pool has a different reward mix, which moves sigma^2 too.
``mean2`` is ``||m_0||^2``, the fresh pool's squared mean gradient (is the signal itself
resolved at this pool size?), and ``drift2_detect`` per tau the smallest ``drift^2`` the
measurement would detect (two-sided 95 %, power 0.8, from the bootstrap's spread): a drift
estimate inside its interval of 0 says "below this", not "none".

``DIR/noise_blocks.npz`` keeps the per-group Gram blocks (every bootstrap can be redone from it)
and ``DIR/noise.json`` the estimates: per point and seed, and pooled over seeds with 95 %
intervals from a bootstrap over seeds and, within each seed, prompt groups; ``alpha`` of the
power-law fit ``sigma(tau) ~ tau^alpha`` over tau >= 1 with its interval (the same bootstrap
replicates), and ``alpha_error`` of the same fit to ``error(tau)``. ``DIR/noise.png`` plots both.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from replay_exp.analysis.stats import percentile_interval
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.seeding import derive_seed
from replay_exp.models.build import build_engine, build_policy
from replay_exp.models.forward import micro_batch, policy_logprobs
from replay_exp.runtime.base import generate_groups
from replay_exp.theory.noise import (
    Blocks,
    CrossBlocks,
    bootstrap_weights,
    drift2,
    fit_power_law,
    gram,
    noise_variance,
    reuse_correlation,
)
from replay_exp.types import RolloutBatch
from replay_exp.update import batch_loss, policy_update

log = logging.getLogger("replay_exp")

TAUS = (0, 1, 2, 4, 8, 16, 32, 64)
Measured = dict[str, Blocks | CrossBlocks]  # one point of one seed: {"sigma/<tau>": ..., ...}
DELTAS = (1, 2, 4, 8, 16)


def per_rollout_grads(policy: torch.nn.Module, pool: RolloutBatch, algo: Any, temperature: float,
                      norm_len: int) -> torch.Tensor:  # fmt: skip
    """``[n, d]``: row i is ``n`` times the gradient of rollout i's share of the pool's loss
    (the pool's ``algo.loss_agg`` normaliser), so the rows average to the pool-loss gradient."""
    from replay_exp.algo import agg_denominator

    params = [p for p in policy.parameters() if p.requires_grad]
    mask = pool.completion_mask_BxC
    denom = agg_denominator(mask, algo.loss_agg, norm_len)
    n = len(pool)
    out = torch.empty(n, sum(p.numel() for p in params))
    policy.train()
    for i in range(n):
        micro = micro_batch(pool, slice(i, i + 1))
        logp, _ = policy_logprobs(policy, micro, temperature)
        loss, _ = batch_loss(algo, micro, logp, None, norm_len, denom)
        grads = torch.autograd.grad(loss * n, params, allow_unused=True)
        out[i] = torch.cat([
            (g if g is not None else torch.zeros_like(p)).reshape(-1)
            for g, p in zip(grads, params, strict=True)
        ])  # fmt: skip
    return out


def measure_seed(overrides: list[str], seed: int, points: list[int], taus: list[int],
                 deltas: list[int], pool_groups: int) -> dict[str, Measured]:  # fmt: skip
    """Train on-policy and collect the Gram blocks of every measurement (module docstring).

    Returns ``{point: {"sigma/<tau>": Blocks, "cross/<tau>": CrossBlocks (stale x fresh),
    "rho/<delta>/cross|first|second": Blocks}}``."""
    cfg, d = resolve(compose([*overrides, "experiment=on_policy", f"seed={seed}"]))
    torch.set_num_threads(d.threads)
    s, a, g = cfg.schedule, cfg.algo, cfg.generation
    built = build_policy(cfg, d)
    policy = built.policy
    torch.manual_seed(derive_seed(cfg.seed, "torch"))
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay
    )
    engine = build_engine(cfg, d, built, share_weights=True)
    per_step = s.batch_size // a.group_size  # prompt groups of an on-policy step

    def rollouts(step: int, n_groups: int, first_group: int = 0, stream: str = "") -> RolloutBatch:
        """Groups generated as the trainer generates them (``runtime.base.generate_groups``),
        at version ``step``; ``stream`` prefixes the seeds' names (a pool's own streams)."""
        return generate_groups(
            cfg, d, built, engine, n_groups=n_groups, first_group=first_group, version=step,
            seed_tags=(step,), stream=stream,
        ).batch  # fmt: skip

    pool_at = {t - tau for t in points for tau in [*taus, max(deltas)]}
    keep_at = {v for t in points for v in range(t - max(deltas), t + 1)}
    pools: dict[int, RolloutBatch] = {}
    weights: dict[int, dict[str, torch.Tensor]] = {}
    grad = lambda pool: per_rollout_grads(policy, pool, a, g.temperature, d.max_new_tokens)  # noqa: E731
    out: dict[str, Measured] = {}
    for step in range(max(points) + 1):
        engine.sync_weights(policy, step)
        if step in pool_at:
            pools[step] = rollouts(step, pool_groups, stream="noise-pool-")
        if step in keep_at:
            weights[step] = copy.deepcopy(policy.state_dict())
        if step in points:
            t, res, current = step, {}, weights[step]
            ids = {tau: pools[t - tau].group_id_B.tolist() for tau in taus}
            fresh = grad(pools[t])
            for tau in taus:
                stale = fresh if tau == 0 else grad(pools[t - tau])
                res[f"sigma/{tau}"] = Blocks.of(gram(stale), ids[tau])
                res[f"cross/{tau}"] = CrossBlocks.of(gram(stale, fresh), ids[tau], ids[0])
            v = t - max(deltas)
            pool, pool_ids = pools[v], pools[v].group_id_B.tolist()
            policy.load_state_dict(weights[v])
            first = grad(pool)
            for delta in deltas:
                policy.load_state_dict(weights[v + delta])
                second = grad(pool)
                res[f"rho/{delta}/cross"] = Blocks.of(gram(first, second), pool_ids)
                res[f"rho/{delta}/first"] = Blocks.of(gram(first), pool_ids)
                res[f"rho/{delta}/second"] = Blocks.of(gram(second), pool_ids)
            policy.load_state_dict(current)
            out[str(t)] = res
            log.info("seed %d: measured at version %d", seed, t)
        if step == max(points):
            break
        # The on-policy step itself, as in replay_exp.train (same seeds and streams).
        batch = rollouts(step, per_step, first_group=step * per_step)
        policy_update(policy, optimizer, batch, a, g.temperature, d.max_new_tokens)
        for old in [k for k in weights if k not in keep_at or k < step - max(deltas)]:
            weights.pop(old, None)
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 else float("nan")


def estimates(blocks: dict[int, Measured], taus: list[int], deltas: list[int],
              w_of=None) -> dict[str, Any]:  # fmt: skip
    """sigma^2, drift^2 and error (sigma^2 + drift^2) per tau, their power-law exponents
    (``alpha`` of sigma, ``alpha_error`` of the error) and rho per delta, averaged over seeds
    (``{seed: {key: blocks}}`` of one point). ``w_of(seed, pool, n_groups)`` gives the group
    weights of a seed's pool ``t - pool`` (None: all 1); the rho pool is pool ``max(deltas)``."""
    seeds = sorted(blocks)
    pools = sorted({*taus, max(deltas)})

    def weights(sd):
        n = len(blocks[sd]["sigma/0"].n)
        return {p: (None if w_of is None else w_of(sd, p, n)) for p in pools}

    w = {sd: weights(sd) for sd in seeds}
    per = lambda f: [float(np.mean([f(blocks[sd], w[sd], tau) for sd in seeds])) for tau in taus]  # noqa: E731
    sigma2 = per(lambda b, ws, tau: noise_variance(b[f"sigma/{tau}"], ws[tau]))
    # tau = 0 is the fresh pool itself: no drift, all of the signal (by definition).
    drift = per(lambda b, ws, tau: 0.0 if tau == 0 else drift2(
        b[f"sigma/{tau}"], b["sigma/0"], b[f"cross/{tau}"], ws[tau], ws[0]))  # fmt: skip
    signal = per(lambda b, ws, tau: 1.0 if tau == 0 else _ratio(
        b[f"cross/{tau}"].mean(ws[tau], ws[0]), b["sigma/0"].different(ws[0])))  # fmt: skip
    error = [s2 + dr for s2, dr in zip(sigma2, drift, strict=True)]
    # Groups whose rollouts all have gradient 0 (equal rewards: advantages 0) add no noise.
    informative = per(lambda b, ws, tau: float(np.average(b[f"sigma/{tau}"].D > 0,
                                                          weights=ws[tau])))  # fmt: skip
    rho = [float(np.mean([
        reuse_correlation(*(blocks[sd][f"rho/{dl}/{k}"] for k in ("cross", "first", "second")),
                          w[sd][max(deltas)])  # fmt: skip
        for sd in seeds
    ])) for dl in deltas]  # fmt: skip
    # ||m_0||^2, the fresh pool's squared mean gradient (pairs of different groups: unbiased),
    # the scale a stale pool's bias drift^2 is measured against.
    mean2 = float(np.mean([blocks[sd]["sigma/0"].different(w[sd][0]) for sd in seeds]))
    out = {"sigma2": sigma2, "drift2": drift, "error": error, "signal": signal, "rho": rho,
           "informative": informative, "mean2": mean2}  # fmt: skip
    for name, values in (("alpha", sigma2), ("alpha_error", error)):
        try:
            out[name], out[f"{name}_log_c"] = fit_power_law(taus, values)
        except ValueError:  # a degenerate resample (no pair of groups, no noise): dropped
            out[name], out[f"{name}_log_c"] = float("nan"), float("nan")
    return out


def bootstrap(blocks: dict[int, dict[str, Measured]], taus: list[int],
              deltas: list[int], n_boot: int, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Point estimates and 95 % intervals (resampling seeds, then prompt groups in each)."""
    rng = np.random.default_rng(seed)
    point = estimates(blocks, taus, deltas)
    seeds = sorted(blocks)
    reps = []
    for _ in range(n_boot):
        drawn = rng.choice(seeds, size=len(seeds), replace=True)
        # a seed drawn k times enters k times, each with its own resample of groups
        resampled = {i: blocks[sd] for i, sd in enumerate(drawn)}
        reps.append(
            estimates(resampled, taus, deltas, lambda _sd, _p, k: bootstrap_weights(rng, k))
        )
    ci = lambda key, j=None: percentile_interval(  # noqa: E731
        np.array([r[key] if j is None else r[key][j] for r in reps])
    )
    out = {**point, "seeds": seeds}
    for key in ("sigma2", "drift2", "error", "signal", "informative"):
        out[f"{key}_ci"] = [ci(key, j) for j in range(len(taus))]
    out["rho_ci"] = [ci("rho", j) for j in range(len(deltas))]
    out["alpha_ci"], out["alpha_error_ci"] = ci("alpha"), ci("alpha_error")
    out["mean2_ci"] = ci("mean2")
    out["drift2_detect"] = [
        detection_limit(np.array([r["drift2"][j] for r in reps])) for j in range(len(taus))
    ]
    return out


# z_{0.975} + z_{0.80} = 1.959964 + 0.841621: a true value this many standard errors from 0 is
# detected by a two-sided 95 % test with probability 0.8.
_Z_DETECT = 2.801585


def detection_limit(replicates: np.ndarray) -> float:
    """The smallest true value a two-sided 95 % test detects with power 0.8, from bootstrap
    replicates of its estimate: 2.80 x their standard deviation (normal approximation; e.g.
    replicates with sd 0.5 give 1.40). NaN replicates (degenerate resamples) are dropped."""
    finite = replicates[np.isfinite(replicates)]
    return float(_Z_DETECT * finite.std(ddof=1)) if len(finite) > 1 else float("nan")


def save_blocks(path: Path, blocks: dict[int, dict[str, Measured]]) -> None:
    """Every block's arrays, named ``seed|point|key|field``, losslessly compacted: an array equal
    to one already stored (a lag-0 cross block is the pool's own Gram block) is stored as
    ``name|same`` holding that name, an exactly symmetric matrix as ``name|triu``, its upper
    triangle (a Gram matrix of one pool): the committed files are 21-34 % smaller."""
    arrays: dict[str, np.ndarray] = {}
    seen: dict[tuple, str] = {}
    for sd, by_point in blocks.items():
        for t, res in by_point.items():
            for key, b in res.items():
                for field in dataclasses.fields(b):
                    name, a = f"{sd}|{t}|{key}|{field.name}", np.asarray(getattr(b, field.name))
                    digest = (a.dtype.str, a.shape, a.tobytes())
                    if digest in seen:
                        arrays[f"{name}|same"] = np.array(seen[digest])
                        continue
                    seen[digest] = name
                    square = a.ndim == 2 and a.shape[0] == a.shape[1]
                    if square and np.array_equal(a, a.T):
                        arrays[f"{name}|triu"] = a[np.triu_indices(a.shape[0])]
                    else:
                        arrays[name] = a
    np.savez_compressed(path, **arrays)


def load_blocks(path: Path) -> dict[int, dict[str, Measured]]:
    """Inverse of :func:`save_blocks`: ``{seed: {point: {key: Blocks}}}`` (also reads files
    written before the compaction: plain names only)."""
    raw = np.load(path)
    full: dict[str, np.ndarray] = {}
    for name in raw.files:
        if name.endswith("|triu"):
            packed = raw[name]
            n = int(round((np.sqrt(8 * packed.size + 1) - 1) / 2))  # n (n + 1) / 2 = size
            a = np.empty((n, n), dtype=packed.dtype)
            upper = np.triu_indices(n)
            a[upper] = packed
            a.T[upper] = packed  # the mirror image: the lower triangle
            full[name.removesuffix("|triu")] = a
        elif not name.endswith("|same"):
            full[name] = raw[name]
    for name in raw.files:
        if name.endswith("|same"):
            full[name.removesuffix("|same")] = full[str(raw[name])]
    parts: dict = {}
    for name, a in full.items():
        sd, t, key, field = name.split("|")
        parts.setdefault(int(sd), {}).setdefault(t, {}).setdefault(key, {})[field] = a
    make = lambda f: CrossBlocks(**f) if "n_a" in f else Blocks(**f)  # noqa: E731
    return {sd: {t: {k: make(f) for k, f in res.items()} for t, res in pts.items()}
            for sd, pts in parts.items()}  # fmt: skip


def summarise(blocks: dict[int, dict[str, Measured]], taus: list[int],
              deltas: list[int], n_boot: int) -> dict[str, Any]:  # fmt: skip
    """Per point (and all points pooled as extra seeds): :func:`bootstrap`."""
    points = sorted({t for by_point in blocks.values() for t in by_point}, key=int)
    out: dict[str, Any] = {"taus": taus, "deltas": deltas, "points": {}}
    for t in points:
        out["points"][t] = bootstrap({sd: blocks[sd][t] for sd in blocks}, taus, deltas, n_boot)
    pooled = {(sd, t): blocks[sd][t] for sd in blocks for t in points}
    out["pooled"] = bootstrap(dict(enumerate(pooled.values())), taus, deltas, n_boot)
    return out


def plot(summary: dict[str, Any], path: Path) -> None:
    """sigma^2(tau) and error(tau) with their power-law fits, and rho(delta), per point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    taus, deltas = np.array(summary["taus"]), np.array(summary["deltas"])
    pos = taus >= 1
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (("sigma2", "alpha", "sigma^2(tau): trace of the gradient covariance"),
              ("error", "alpha_error", "error(tau) = sigma^2 + drift^2"))  # fmt: skip
    for label, est in [*summary["points"].items(), ("pooled", summary["pooled"])]:
        for ax, (key, fit, title) in zip(axes, panels, strict=False):
            v, ci = np.array(est[key]), np.array(est[f"{key}_ci"])
            lo, hi = est[f"{fit}_ci"]
            line = ax.errorbar(taus[pos], v[pos], yerr=[v[pos] - ci[pos, 0], ci[pos, 1] - v[pos]],
                               marker="o", capsize=3, label=f"version {label}: {fit} = "
                               f"{est[fit]:.3f} [{lo:.3f}, {hi:.3f}]")  # fmt: skip
            ax.plot(taus[pos], np.exp(2 * est[f"{fit}_log_c"]) * taus[pos] ** (2 * est[fit]),
                    "--", color=line[0].get_color())  # fmt: skip
            ax.set(xscale="log", yscale="log", xlabel="staleness tau (versions)", title=title)
        r, rci = np.array(est["rho"]), np.array(est["rho_ci"])
        axes[2].errorbar(deltas, r, yerr=[r - rci[:, 0], rci[:, 1] - r], marker="o", capsize=3,
                         label=f"version {label}")  # fmt: skip
    axes[2].set(xscale="log", xlabel="versions between two uses (delta)",
                title="rho(delta): one rollout's gradients at two uses")  # fmt: skip
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle("dashed: power-law fits over tau >= 1; bars: 95 % bootstrap intervals")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--at", type=int, nargs="+", default=[128, 512], help="versions measured")
    ap.add_argument("--taus", type=int, nargs="+", default=list(TAUS))
    ap.add_argument("--deltas", type=int, nargs="+", default=list(DELTAS))
    ap.add_argument("--pool-groups", type=int, default=32, help="prompt groups per pool")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap replicates")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the trained config")
    args = ap.parse_args(argv)
    if 0 not in args.taus or min(args.taus) < 0:
        ap.error(f"--taus must include 0 and be >= 0, got {args.taus}")
    if min(args.deltas) < 1:
        ap.error(f"--deltas must be >= 1, got {args.deltas}")
    if min(args.at) < max(max(args.taus), max(args.deltas)):
        ap.error(f"--at {args.at}: every point must be >= the largest tau and delta")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    blocks = {sd: measure_seed(args.overrides, sd, sorted(args.at), args.taus, args.deltas,
                               args.pool_groups) for sd in args.seeds}  # fmt: skip
    seconds = time.perf_counter() - t0
    save_blocks(args.out / "noise_blocks.npz", blocks)
    summary = summarise(blocks, args.taus, args.deltas, args.boot)
    command = "python -m replay_exp.theory.measure " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    summary.update(overrides=args.overrides, pool_groups=args.pool_groups, seconds=seconds,
                   command=command)  # fmt: skip
    (args.out / "noise.json").write_text(json.dumps(summary, indent=2))
    plot(summary, args.out / "noise.png")
    p = summary["pooled"]
    print(f"alpha = {p['alpha']:.3f} [{p['alpha_ci'][0]:.3f}, {p['alpha_ci'][1]:.3f}] (error: "
          f"{p['alpha_error']:.3f} [{p['alpha_error_ci'][0]:.3f}, {p['alpha_error_ci'][1]:.3f}]); "
          + ", ".join(f"rho({dl}) = {r:.3f} [{lo:.3f}, {hi:.3f}]"
                      for dl, r, (lo, hi) in zip(args.deltas, p["rho"], p["rho_ci"], strict=True))
          + f"; {seconds:.0f} s")  # fmt: skip
    lo, hi = p["mean2_ci"]
    print(f"||m_0||^2 (fresh mean gradient) = {p['mean2']:.3f} [{lo:.3f}, {hi:.3f}]; drift^2 "
          "detection limit (80 % power) per tau: "
          + ", ".join(f"{tau}: {d:.3f}" for tau, d in zip(args.taus, p["drift2_detect"],
                                                        strict=True) if tau > 0))  # fmt: skip


if __name__ == "__main__":
    main()
