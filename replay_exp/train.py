"""The one train entrypoint: GRPO with verifiable rewards through a replay buffer.

    python -m replay_exp.train [group=option ...] [key=value ...]   # or: replay-exp-train

The loop (``run``) reads top to bottom like the algorithm:

    for step until budget:
        maybe sync generator weights (every k steps)
        fresh = generate R rollouts (R/G prompts x G samples; under schedule=async the
                emulated cluster's arrivals), rewards, frozen advantages
        buffer.add(fresh, step)            # the eviction policy decides what leaves
        batch = buffer.sample(B, step)     # the sampling policy; per-use telemetry recorded
        one policy update on batch (GRPO or AsymRE)
        ledger + log; every n steps evaluate on the held-out split
        every c steps snapshot every component (relaunching resumes from the latest)

Step s of the log is the state after s updates (the policy version); row 0 is the initial
policy's evaluation. Snapshot step_s (run_dir/checkpoints) is also the state after s updates.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import sys
import time
import warnings
from functools import partial
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
from replay_exp.checkpoint import (
    Checkpointer,
    CheckpointError,
    GeneratorState,
    RNGState,
    Snapshot,
    SnapshotWarning,
    atomic_write_text,
    truncate_metrics,
)
from replay_exp.compute import Ledger, flop_params, sequence_lengths
from replay_exp.config import (
    EVAL_UNITS,
    ConfigError,
    Derived,
    expand_model_shorthand,
    register_configs,
    resolve,
)
from replay_exp.evaluate import encode_details, evaluate
from replay_exp.logging import (
    MetricsWriter,
    format_eval,
    make_logger,
    prefixed,
    update_metrics,
    write_telemetry,
)
from replay_exp.models import load_policy
from replay_exp.rollout import HFGenerator, SamplingParams, engine_model_dir, make_generator
from replay_exp.rollout.collect import generate_rollouts, prompt_lengths, recompute_behaviour_logp
from replay_exp.rundir import RunLock, RunStart, config_yaml, prepare_run_dir
from replay_exp.runtime import RankFailed, join_slurm, run_distributed, slurm_rank
from replay_exp.schedule import Every, OnGrid, WeightHistory, derive_seed, make_arrivals
from replay_exp.tasks import make_task
from replay_exp.update import policy_update

log = logging.getLogger("replay_exp")
register_configs()

# Append-only logs of a run, one JSON row per line with a "step": metrics (the source of truth)
# and the per-problem results of every evaluation (replay_exp.evaluate.encode_details).
LOG_FILES = ("metrics.jsonl", "eval_details.jsonl")


def run(
    cfg: DictConfig, derived: Derived, run_dir: Path, start: RunStart | None = None
) -> dict[str, Any]:
    """Train with the resolved ``cfg`` and write everything into ``run_dir``: a fresh run, or
    the resume of the unfinished run there (``prepare_run_dir`` decides, unless ``start`` is
    given); a finished run is left untouched and its summary returned."""
    run_dir = Path(run_dir)
    if start is None:
        start = prepare_run_dir(cfg, derived, run_dir)
    if start.finished is not None:
        return _already_finished(run_dir, start)
    with RunLock(run_dir) as lock:  # one live run per directory; released on exit
        start = prepare_run_dir(cfg, derived, run_dir)  # again, now that nobody else writes
        if start.finished is not None:
            return _already_finished(run_dir, start)
        return _run_locked(cfg, derived, run_dir, start, lock.notes)


def _already_finished(run_dir: Path, start: RunStart) -> dict[str, Any]:
    print(f"run already finished: {run_dir / 'summary.json'} says so; nothing to do")
    for note in start.notes:
        print(note)
    return start.finished


def _run_locked(
    cfg: DictConfig, derived: Derived, run_dir: Path, start: RunStart, notes: list[str]
) -> dict[str, Any]:
    torch.set_num_threads(derived.threads)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    file_log = logging.FileHandler(run_dir / "train.log")
    file_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger().addHandler(file_log)
    log.info("run dir: %s", run_dir)
    for note in [*notes, *start.notes]:
        log.warning(note)
    if start.snapshot is None:
        for name in LOG_FILES:  # at most an initial eval: redone
            (run_dir / name).unlink(missing_ok=True)
        atomic_write_text(run_dir / "config.yaml", config_yaml(cfg, derived))
    else:
        dropped = truncate_metrics(run_dir / "metrics.jsonl", start.snapshot.step)
        if (run_dir / "eval_details.jsonl").is_file():
            truncate_metrics(run_dir / "eval_details.jsonl", start.snapshot.step)
        log.info(
            "resuming from %s (step %d); dropped %d metrics.jsonl lines past it",
            start.snapshot.path,
            start.snapshot.step,
            dropped,
        )
    log.info(
        "B=%d R=%.4g (y=B/R=%.3g) N=%d (x=N/R=%.3g) steps=%d",
        cfg.schedule.batch_size,
        derived.rollouts_per_step,
        derived.reuse_ratio,
        derived.capacity,
        derived.staleness_horizon,
        derived.total_steps,
    )
    try:
        if cfg.runtime.name == "distributed":  # W + T processes (replay_exp.runtime)
            return run_distributed(cfg, derived, run_dir, start.snapshot)
        return _train(cfg, derived, run_dir, start.snapshot)
    finally:
        logging.getLogger().removeHandler(file_log)
        file_log.close()


def _train(
    cfg: DictConfig, d: Derived, run_dir: Path, snapshot: Snapshot | None = None
) -> dict[str, Any]:
    s, a, g = cfg.schedule, cfg.algo, cfg.generation
    task = make_task(cfg.task)
    policy, tokenizer, source = load_policy(cfg.model, cfg.task, task, d.device, d.dtype)
    log.info("policy: %s (%s)", cfg.model.name, source)
    chat = bool(cfg.model.chat_template)
    dropped = task.fit_prompts(partial(prompt_lengths, tokenizer, chat=chat), d.max_prompt_len)
    if dropped:
        log.warning("dropped %d problems longer than %d prompt tokens", dropped, d.max_prompt_len)
    ref_model = None
    if a.kl_coef > 0:
        ref_model = load_policy(cfg.model, cfg.task, task, d.device, d.dtype)[0].eval()
    torch.manual_seed(derive_seed(cfg.seed, "torch"))

    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay
    )
    share = s.sync_every == 1 and s.sync_lag == 0  # the generator samples the trainer's weights
    model_dir = engine_model_dir(cfg, source, policy, tokenizer, run_dir / "generator_model")
    generator = make_generator(
        g, policy, tokenizer, share_weights=share, model_dir=model_dir,
        max_model_len=d.max_prompt_len + d.max_new_tokens, dtype=d.dtype,
        seed=derive_seed(cfg.seed, "engine"), device=d.device,
    )  # fmt: skip
    if model_dir is not None and Path(model_dir).parent == run_dir:
        shutil.rmtree(model_dir)  # the engine holds its weights now; the copy is not needed
    # Evaluation samples the trainer's current weights: through the engine when it follows the
    # trainer at every step (synced right before each eval), else from the trainer's module.
    if g.backend != "hf" and share:
        evaluator = generator
    else:
        evaluator = HFGenerator(
            policy, tokenizer.pad_token_id, tokenizer.eos_token_id,
            chunk_size=g.chunk_size, sampler=g.sampler,
        )  # fmt: skip
    buffer = make_buffer(
        cfg.buffer,
        capacity=d.capacity,
        max_prompt_len=d.max_prompt_len,
        max_completion_len=d.max_new_tokens,
        seed=derive_seed(cfg.seed, "buffer"),
    )
    arrivals = make_arrivals(s, d, cfg.compute.mu, a.group_size)
    history = WeightHistory(s.sync_lag)  # weights of recent versions, for a sync lag
    history.push(0, policy)
    ledger = Ledger(
        mu=cfg.compute.mu,
        batch_size=s.batch_size,
        units_per_step=d.paper_units_per_step if s.name == "async" else None,
        n_params=flop_params(policy),
        n_layers=policy.config.num_hidden_layers,
        hidden=policy.config.hidden_size,
    )
    eval_problems = task.eval_problems()[: cfg.eval.n_problems]
    sampling = SamplingParams(g.temperature, g.top_p, d.max_new_tokens)
    sync, log_due = Every(s.sync_every), Every(cfg.logger.log_every)
    eval_due = OnGrid(cfg.eval.every)  # on steps, paper units or rollouts (eval.unit)
    eval_x = partial(getattr, ledger, EVAL_UNITS[cfg.eval.unit])
    # metrics.jsonl (the source of truth), mirrored to W&B under logger=wandb.
    logger = make_logger(
        cfg, run_dir, {**OmegaConf.to_container(cfg), "derived": dataclasses.asdict(d)}
    )
    # Everything a resumed run needs to continue bit-identically, by name: new stateful parts
    # (state_dict / load_state_dict) go here. The eval dicts travel as JSON with each save.
    snapshots = Checkpointer(
        run_dir / "checkpoints",
        {
            "policy": policy,
            "optimizer": optimizer,
            "generator": GeneratorState(generator),
            "weight_history": history,
            "buffer": buffer,
            "ledger": ledger,
            "rng": RNGState(),
        },
        keep=cfg.checkpoint.keep,
        sync_files=[run_dir / name for name in LOG_FILES],
    )
    details_log = MetricsWriter(run_dir / "eval_details.jsonl")
    snapshot_due = Every(cfg.checkpoint.every) if cfg.checkpoint.every else (lambda step: False)

    def run_eval(step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        if evaluator is generator and generator.version != step:
            generator.sync_weights(policy, step)  # the engine then already holds version step
        out, details = evaluate(
            evaluator, policy, tokenizer, task, eval_problems, cfg.eval,
            d.max_new_tokens, derive_seed(cfg.seed, "eval", step), chat=chat,
            micro_batch_size=a.micro_batch_size,
        )  # fmt: skip
        ledger.add_eval(time.perf_counter() - t0)
        x = {"compute/paper_units": ledger.paper_units, "compute/rollouts": ledger.rollouts}
        details_log.write({"step": step, **x, **encode_details(details)})
        return {f"eval/{k}": v for k, v in out.items()}

    first_eval, start = None, 0
    if snapshot is not None:  # resume: every component, the eval dicts and the step
        evals = snapshots.restore(snapshot)
        first_eval, last_eval, start = evals["first_eval"], evals["last_eval"], snapshot.step
    else:
        if cfg.eval.at_start:
            first_eval = run_eval(0)
            logger.log({"step": 0, **first_eval, **prefixed("compute", ledger.metrics())})
            log.info("step 0 | %s", format_eval(first_eval))
        last_eval: dict[str, float] = dict(first_eval or {})
        if snapshot_due(0):
            snapshots.save(0, first_eval=first_eval, last_eval=last_eval)

    bar = tqdm(
        total=d.total_steps, initial=start, disable=not cfg.logger.progress, dynamic_ncols=True
    )
    with logging_redirect_tqdm():
        for step in range(start, d.total_steps):
            x_before = eval_x()
            if sync(step) and not (share and generator.version == step):
                generator.sync_weights(*reversed(history.weights_for(step, policy)))

            # Generate the step's fresh rollouts (R/G prompts x G samples under the sync
            # schedule, the emulated arrivals under async), scored, advantages frozen.
            t0 = time.perf_counter()
            n_groups, first_group = arrivals.groups_at(step), arrivals.groups_before(step)
            fresh, logp_stats = None, {}  # the async emulation may deliver nothing at some steps
            if n_groups:
                prompts = task.sample_train(
                    np.random.default_rng(derive_seed(cfg.seed, "prompts", step)), n_groups
                )
                fresh = generate_rollouts(
                    generator, tokenizer, task, prompts, a.group_size, sampling,
                    seed=derive_seed(cfg.seed, "gen", step), step=step,
                    first_uid=first_group * a.group_size, first_group=first_group,
                    normalize_std=a.adv_normalize_std, chat=chat,
                )  # fmt: skip
                if g.behaviour_logp == "trainer":  # the trainer's log-probs replace the engine's
                    fresh, logp_stats = recompute_behaviour_logp(
                        policy, fresh, g.temperature, a.micro_batch_size
                    )
                seconds = time.perf_counter() - t0
                ledger.add_generation(
                    sequence_lengths(fresh), int(fresh.completion_mask_BxC.sum()), seconds
                )
                buffer.add(fresh, step)
            # Sample a batch and update. With max_reuse under the async emulation the buffer can
            # run dry; the trainers then idle for this step (no update, compute still charged).
            batch, stats, t0 = None, {}, time.perf_counter()
            if len(buffer):
                batch = buffer.sample(s.batch_size, step)
                stats = policy_update(
                    policy, optimizer, batch, a, g.temperature, d.max_new_tokens, ref_model,
                    version=step if cfg.logger.diagnostics else None,
                )  # fmt: skip
            seconds = time.perf_counter() - t0 - stats.get("diag/seconds", 0.0)
            ledger.add_training(sequence_lengths(batch), stats.get("tokens", 0), seconds)

            version = step + 1
            history.push(version, policy)
            row: dict[str, Any] = {}
            if log_due(version) or version == d.total_steps:
                row = {"step": version, "policy/version": version}
                row.update(step_metrics(fresh, batch, stats, buffer, generator))
                row.update(prefixed("generation", logp_stats))
            if eval_due(x_before, eval_x()) or version == d.total_steps:
                last_eval = run_eval(version)
                write_telemetry(run_dir, version, buffer.telemetry(), logger)
                row.update({"step": version, **last_eval})
                log.info("step %d | %s", version, format_eval(last_eval))
            if row:
                row.update(prefixed("compute", ledger.metrics()))
                logger.log(row)
            if snapshot_due(version):
                snapshots.save(version, first_eval=first_eval, last_eval=last_eval)
            bar.set_postfix(
                reward=f"{row.get('train/reward', float('nan')):.2f}",
                pass1=f"{last_eval.get('eval/pass@1', float('nan')):.3f}",
                refresh=False,
            )
            bar.update(1)
    bar.close()

    summary = {
        "status": "finished",
        "steps": d.total_steps,
        "initial": first_eval,
        "final": last_eval,
        "compute": ledger.metrics(),
    }
    logger.close(summary)
    details_log.close()
    if hasattr(generator, "close"):
        generator.close()
    if cfg.save_final_model:
        policy.save_pretrained(run_dir / "final_model")
        tokenizer.save_pretrained(run_dir / "final_model")
    # Last and atomic: "finished" means everything above is on disk (relaunches skip the run).
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    log.info("done: %s", format_eval(last_eval))
    return summary


def step_metrics(fresh, batch, stats, buffer, generator) -> dict[str, Any]:
    """The training row of one step (``fresh`` is None when no rollout arrived)."""
    nan = float("nan")
    return {
        "train/reward": nan if fresh is None else float(fresh.reward_B.mean()),
        "train/fresh_rollouts": 0 if fresh is None else len(fresh),
        "train/response_len": (
            nan if fresh is None else float(fresh.completion_mask_BxC.sum(1).float().mean())
        ),
        "train/batch_reward": nan if batch is None else float(batch.reward_B.mean()),
        **update_metrics(stats),
        **prefixed("buffer", buffer.stats()),
        "policy/generator_version": generator.version,
    }


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any]:
    try:
        resolved, derived = resolve(cfg)
        if resolved.runtime.name == "distributed" and (slurm_rank() or (0,))[0] > 0:
            # A SLURM task other than 0 of a distributed run: task 0 prepares run_dir.
            return join_slurm(resolved, derived, Path(resolved.run_dir))
        with warnings.catch_warnings():  # run() logs skipped snapshots; errors name them
            warnings.simplefilter("ignore", SnapshotWarning)
            start = prepare_run_dir(resolved, derived)
    except (ConfigError, CheckpointError) as e:  # one line, nothing written, no model built
        kind = "config error" if isinstance(e, ConfigError) else "resume error"
        print(f"{kind}: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        return run(resolved, derived, start.run_dir, start)
    except RankFailed as e:  # runtime=distributed: one line; the snapshot is on disk
        print(f"runtime error: {e}", file=sys.stderr)
        sys.exit(1)


def cli() -> None:
    """``python -m replay_exp.train`` / ``replay-exp-train``: :func:`main` after expanding the
    ``model=<dir or hub id>`` shorthand (``config.expand_model_shorthand``)."""
    try:
        sys.argv[1:] = expand_model_shorthand(sys.argv[1:])
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
