"""The one train entrypoint: GRPO with verifiable rewards through a replay buffer.

    python -m replay_exp.train [group=option ...] [key=value ...]   # or: replay-exp-train

The loop (``run``) reads top to bottom like the algorithm:

    for step until budget:
        maybe sync generator weights (every k steps)
        fresh = generate R rollouts (R/G prompts x G samples), rewards, frozen advantages
        buffer.add(fresh, step)
        batch = buffer.sample(B, step)
        one GRPO update on batch
        ledger + log; every n steps evaluate on the held-out split

Step s of the log is the state after s updates (the policy version); row 0 is the initial
policy's evaluation.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
import transformers
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from replay_exp.buffer import make_buffer
from replay_exp.compute import Ledger, flop_params
from replay_exp.config import ConfigError, Derived, register_configs, resolve
from replay_exp.evaluate import evaluate
from replay_exp.logging import MetricsWriter
from replay_exp.models import load_policy
from replay_exp.rollout import BACKENDS, HFGenerator, SamplingParams
from replay_exp.rollout.collect import generate_rollouts
from replay_exp.schedule import Every, derive_seed
from replay_exp.tasks import make_task
from replay_exp.update import grpo_update

log = logging.getLogger("replay_exp")
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

register_configs()


def prepare_run_dir(cfg: DictConfig) -> Path:
    """Check the run directory can take this run; raise ConfigError if it holds one already."""
    run_dir = Path(cfg.run_dir)
    if (run_dir / "metrics.jsonl").exists() or (run_dir / "config.yaml").exists():
        raise ConfigError(f"run_dir={run_dir} already holds a run; choose another run_dir")
    return run_dir


def run(cfg: DictConfig, derived: Derived, run_dir: Path) -> dict[str, Any]:
    """Train with the resolved ``cfg`` and write everything into ``run_dir``."""
    torch.set_num_threads(derived.threads)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    run_dir.mkdir(parents=True, exist_ok=True)
    file_log = logging.FileHandler(run_dir / "train.log")
    file_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger().addHandler(file_log)
    saved = OmegaConf.to_container(cfg)
    saved["derived"] = dataclasses.asdict(derived)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    log.info("run dir: %s", run_dir)
    log.info(
        "B=%d R=%d (y=B/R=%.3g) N=%d (x=N/R=%.3g) steps=%d",
        cfg.schedule.batch_size,
        derived.rollouts_per_step,
        derived.reuse_ratio,
        derived.capacity,
        derived.staleness_horizon,
        derived.total_steps,
    )
    try:
        return _train(cfg, derived, run_dir)
    finally:
        logging.getLogger().removeHandler(file_log)
        file_log.close()


def _train(cfg: DictConfig, d: Derived, run_dir: Path) -> dict[str, Any]:
    s, a, g = cfg.schedule, cfg.algo, cfg.generation
    task = make_task(cfg.task)
    policy, tokenizer, source = load_policy(cfg.model, cfg.task, task, d.device)
    log.info("policy: %s (%s)", cfg.model.name, source)
    ref_model = None
    if a.kl_coef > 0:
        ref_model = load_policy(cfg.model, cfg.task, task, d.device)[0].eval()
    torch.manual_seed(derive_seed(cfg.seed, "torch"))

    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay
    )
    generator = BACKENDS[g.backend](
        policy,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        share_weights=s.sync_every == 1,
        chunk_size=g.chunk_size,
    )
    evaluator = HFGenerator(
        policy, tokenizer.pad_token_id, tokenizer.eos_token_id, chunk_size=g.chunk_size
    )
    buffer = make_buffer(
        cfg.buffer.name,
        capacity=d.capacity,
        max_prompt_len=d.max_prompt_len,
        max_completion_len=d.max_new_tokens,
        seed=derive_seed(cfg.seed, "buffer"),
    )
    ledger = Ledger(
        mu=cfg.compute.mu,
        batch_size=s.batch_size,
        n_params=flop_params(policy),
        n_layers=policy.config.num_hidden_layers,
        hidden=policy.config.hidden_size,
    )
    eval_problems = task.eval_problems()[: cfg.eval.n_problems]
    sampling = SamplingParams(g.temperature, g.top_p, d.max_new_tokens)
    sync, eval_due, log_due = (
        Every(s.sync_every),
        Every(cfg.eval.every),
        Every(cfg.logger.log_every),
    )
    writer = MetricsWriter(run_dir / "metrics.jsonl")

    def run_eval(step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        out = evaluate(
            evaluator, policy, tokenizer, task, eval_problems, cfg.eval,
            d.max_new_tokens, derive_seed(cfg.seed, "eval", step),
        )  # fmt: skip
        ledger.add_eval(time.perf_counter() - t0)
        return {f"eval/{k}": v for k, v in out.items()}

    first_eval = None
    if cfg.eval.at_start:
        first_eval = run_eval(0)
        writer.write({"step": 0, **first_eval, **_prefixed("compute", ledger.metrics())})
        log.info("step 0 | %s", _fmt(first_eval))

    last_eval: dict[str, float] = dict(first_eval or {})
    bar = tqdm(total=d.total_steps, disable=not cfg.logger.progress, dynamic_ncols=True)
    with logging_redirect_tqdm():
        for step in range(d.total_steps):
            if sync(step):
                generator.sync_weights(policy, version=step)

            # Generate R fresh rollouts: R/G prompts x G samples, scored, advantages frozen.
            t0 = time.perf_counter()
            prompts = task.sample_train(
                np.random.default_rng(derive_seed(cfg.seed, "prompts", step)), d.prompts_per_step
            )
            fresh = generate_rollouts(
                generator, tokenizer, task, prompts, a.group_size, sampling,
                seed=derive_seed(cfg.seed, "gen", step), step=step,
                first_uid=step * d.rollouts_per_step, first_group=step * d.prompts_per_step,
                normalize_std=a.adv_normalize_std,
            )  # fmt: skip
            ledger.add_generation(
                _lengths(fresh), int(fresh.completion_mask_BxC.sum()), time.perf_counter() - t0
            )

            buffer.add(fresh, step)
            batch = buffer.sample(s.batch_size, step)

            t0 = time.perf_counter()
            stats = grpo_update(
                policy, optimizer, batch, a, g.temperature, d.max_new_tokens, ref_model
            )
            ledger.add_training(_lengths(batch), stats["tokens"], time.perf_counter() - t0)

            version = step + 1
            row: dict[str, Any] = {}
            if log_due(version) or version == d.total_steps:
                row.update(
                    {
                        "step": version,
                        "train/reward": float(fresh.reward_B.mean()),
                        "train/batch_reward": float(batch.reward_B.mean()),
                        "train/response_len": float(
                            fresh.completion_mask_BxC.sum(1).float().mean()
                        ),
                        **_prefixed("loss", stats),
                        **_prefixed("buffer", buffer.stats()),
                        "policy/version": version,
                        "policy/generator_version": generator.version,
                    }
                )
            if eval_due(version) or version == d.total_steps:
                last_eval = run_eval(version)
                row.update({"step": version, **last_eval})
                log.info("step %d | %s", version, _fmt(last_eval))
            if row:
                row.update(_prefixed("compute", ledger.metrics()))
                writer.write(row)
            bar.set_postfix(
                reward=f"{float(fresh.reward_B.mean()):.2f}",
                pass1=f"{last_eval.get('eval/pass@1', float('nan')):.3f}",
                refresh=False,
            )
            bar.update(1)
    bar.close()
    writer.close()

    summary = {
        "status": "finished",
        "steps": d.total_steps,
        "initial": first_eval,
        "final": last_eval,
        "compute": ledger.metrics(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if cfg.save_final_model:
        policy.save_pretrained(run_dir / "final_model")
        tokenizer.save_pretrained(run_dir / "final_model")
    log.info("done: %s", _fmt(last_eval))
    return summary


def _lengths(batch) -> torch.Tensor:
    """Real tokens (prompt + completion) per rollout."""
    return batch.prompt_mask_BxP.sum(1) + batch.completion_mask_BxC.sum(1)


def _prefixed(prefix: str, d: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}/{k}": v for k, v in d.items()}


def _fmt(metrics: dict[str, float]) -> str:
    keys = ["eval/pass@1", "eval/pass@8_sampled", "eval/sample_reward", "eval/entropy"]
    return "  ".join(f"{k.removeprefix('eval/')} {metrics[k]:.3f}" for k in keys if k in metrics)


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any]:
    try:
        resolved, derived = resolve(cfg)
        run_dir = prepare_run_dir(resolved)
    except ConfigError as e:  # one line, nothing written, before any model is built
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    return run(resolved, derived, run_dir)


if __name__ == "__main__":
    main()
