"""The loop, once: GRPO with verifiable rewards through a replay buffer, for the one process
(``runtime=inprocess``) and for each trainer rank of ``runtime=distributed``.

``train`` reads top to bottom like the algorithm:

    for step until budget:
        fresh = runtime.take(step)         # R rollouts (R/G prompts x G samples) generated here,
                                           # the emulated cluster's arrivals (schedule=async), or
                                           # what the generator ranks delivered (distributed);
                                           # scored, advantages frozen at generation
        buffer.add(fresh, step)            # the eviction policy decides what leaves
        batch = buffer.sample(B, step)     # the sampling policy; per-use telemetry recorded
        one policy update on batch         # GRPO or AsymRE; DDP / FSDP share the gradient
        controller.decide(version)         # controller=adaptive, every K steps: R, N, lr from
                                           # the window's signals (every trainer rank's, one
                                           # decision broadcast); its budget rule ends the run
        runtime.after_update(version)      # weights to the generators (every k steps)
        ledger + log; on the eval grid evaluate on the held-out split
        every c steps snapshot every component (relaunching resumes from the latest)
    drain what is in flight, account for every rollout, write the summary

The two runtimes (``replay_exp.runtime.base.Runtime``) differ only in where arrivals come from
and in a collective; ``build_parts`` makes what a trainer holds for both. Step s of the log is
the state after s updates (the policy version); row 0 is the initial policy's evaluation.
Snapshot step_s (run_dir/checkpoints) is also the state after s updates.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from replay_exp.buffer import as_spec, make_buffer
from replay_exp.buffer.replay import collect_stats, collect_telemetry
from replay_exp.checkpoint import atomic_write_text
from replay_exp.compute.costmodel import as_schedule
from replay_exp.compute.ledger import Ledger, attention_width, flop_params, sequence_lengths
from replay_exp.config.derive import Derived
from replay_exp.config.errors import RunStopped
from replay_exp.config.schemas import EVAL_UNITS
from replay_exp.config.seeding import derive_seed
from replay_exp.control import make_controller
from replay_exp.eval.evaluate import encode_details, evaluate
from replay_exp.models import load_policy
from replay_exp.models.build import BuiltPolicy, build_evaluator, build_policy
from replay_exp.models.precision import DTYPES
from replay_exp.runlog import (
    MetricsWriter,
    code_provenance,
    format_eval,
    make_logger,
    prefixed,
    read_provenance,
    update_metrics,
    write_telemetry,
)
from replay_exp.runtime.accounting import account
from replay_exp.runtime.base import Arrival, Runtime
from replay_exp.runtime.schedule import Every, OnGrid
from replay_exp.update import policy_update

log = logging.getLogger("replay_exp")


@dataclasses.dataclass
class Parts:
    """What a trainer holds, built once by :func:`build_parts` for one process or for each
    trainer rank of ``runtime=distributed``. ``logger``, ``details_log`` and ``evaluator``
    exist on the lead (the one process, or trainer rank 0) only."""

    built: BuiltPolicy  # task, tokenizer, policy (unwrapped: what is evaluated, saved, pushed)
    model: torch.nn.Module  # what the update trains: ``built.policy``, or its DDP / FSDP wrapper
    ref_model: torch.nn.Module | None  # frozen initial policy, for algo.kl_coef > 0
    optimizer: torch.optim.Optimizer
    buffer: Any  # the replay buffer, or this trainer rank's shard of it
    ledger: Ledger  # this process's compute; the node's is Runtime.node_ledger()
    eval_problems: list
    lead: bool = True
    logger: Any = None
    details_log: MetricsWriter | None = None
    evaluator: Any = None  # the generation backend evaluations sample from
    controller: Any = None  # controller=adaptive's (replay_exp.control); None: fixed knobs
    response_budget: int = 0  # max new tokens of a rollout (d.max_new_tokens; 0: no check)
    truncation_warned: bool = False  # the truncation warning is given once per process


def build_parts(
    cfg: DictConfig,
    d: Derived,
    run_dir: Path,
    *,
    rank: int | None = None,
    loaded: tuple | None = None,
    policy_state: dict | None = None,
    wrap: Any = None,
) -> Parts:
    """The trainer's parts: the task and the policy (``models.build.build_policy``;
    ``loaded``: an already loaded (policy, tokenizer, origin); ``policy_state``: weights to
    start from), the frozen reference, the optimizer, the buffer (a rank's shard of N/T), the
    ledger, the logger, the evaluator.

    ``rank``: the trainer rank of ``runtime=distributed`` (None: the one process), which seeds
    its own torch and buffer streams; ``wrap(policy) -> (model, eval_model)`` makes the
    data-parallel module and the copy that rank 0 evaluates (None: the policy itself)."""
    a = cfg.algo
    lead = not rank
    tags = () if rank is None else (rank,)
    built = build_policy(cfg, d, loaded=loaded)
    policy = built.policy
    if lead:
        log.info("policy: %s (%s)", cfg.model.name, built.origin)
    if built.dropped and lead:
        log.warning(
            "dropped %d problems longer than %d prompt tokens", built.dropped, d.max_prompt_len
        )
    ref_model = None
    if a.kl_coef > 0:  # every trainer rank holds its own frozen copy
        ref_model = load_policy(cfg.model, cfg.task, built.task, d.device, d.param_dtype, d.dtype)[
            0
        ].eval()
    if policy_state is not None:
        policy.load_state_dict(policy_state)
    torch.manual_seed(derive_seed(cfg.seed, "torch", *tags))
    model, eval_model = wrap(policy) if wrap else (policy, policy)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay
    )
    spec = cfg.buffer if rank is None else as_spec(cfg.buffer, shards=1)
    capacity = d.capacity_per_trainer  # under controller=adaptive the most it may set
    if d.max_capacity is not None:
        capacity = d.max_capacity // (1 if rank is None else cfg.schedule.trainers)
    buffer = make_buffer(
        spec, capacity=capacity, max_prompt_len=d.max_prompt_len,
        max_completion_len=d.max_new_tokens, seed=derive_seed(cfg.seed, "buffer", *tags),
    )  # fmt: skip
    # controller=adaptive: it sets the buffer's N (from derived.capacity, up to the store's
    # max_capacity; a trainer rank's shard: N / T), the optimizer's lr and, under
    # schedule=sync, the step's R.
    controller = make_controller(cfg, d, buffer, optimizer)
    ledger = Ledger(
        mu=cfg.compute.mu,
        mu_schedule=as_schedule(cfg.compute.mu_schedule),
        batch_size=cfg.schedule.batch_size,
        units_per_step=d.paper_units_per_step if cfg.schedule.name == "async" else None,
        n_params=flop_params(policy),
        n_layers=policy.config.num_hidden_layers,
        hidden=attention_width(policy.config),
    )
    parts = Parts(
        built=built, model=model, ref_model=ref_model, optimizer=optimizer, buffer=buffer,
        ledger=ledger, eval_problems=built.task.eval_problems()[: cfg.eval.n_problems], lead=lead,
        controller=controller, response_budget=d.max_new_tokens,
    )  # fmt: skip
    if lead:
        # metrics.jsonl (the source of truth), mirrored to W&B under logger=wandb.
        parts.logger = make_logger(
            cfg, run_dir, {**OmegaConf.to_container(cfg), "derived": dataclasses.asdict(d)}
        )
        parts.details_log = MetricsWriter(run_dir / "eval_details.jsonl")
        # Evaluation samples the trainer's weights with the hf backend, whatever generates the
        # rollouts (a vllm generator's engine lives in another process under
        # runtime=distributed).
        parts.evaluator = build_evaluator(cfg.generation, eval_model, built.tokenizer)
    return parts


def train(cfg: DictConfig, d: Derived, run_dir: Path, p: Parts, rt: Runtime) -> dict | None:
    """The loop (module docstring), for the one process or one trainer rank; ``rt`` says
    where the arrivals come from and what is shared between ranks. The lead returns the
    run's summary (None elsewhere)."""
    a, g = cfg.algo, cfg.generation
    log_due, eval_due = Every(cfg.logger.log_every), OnGrid(cfg.eval.every)
    snapshot_due = Every(cfg.checkpoint.every) if cfg.checkpoint.every else (lambda step: False)

    def eval_x(led: Ledger) -> float:  # eval.unit: steps, paper units or rollouts
        return getattr(led, EVAL_UNITS[cfg.eval.unit])

    led = rt.node_ledger()
    if rt.resumed is not None:  # every component restored by the runtime; the eval dicts too
        start, first_eval, last_eval = rt.resumed
    else:
        start, first_eval = 0, None
        if cfg.eval.at_start and p.lead:
            first_eval = run_eval(cfg, d, p, rt, 0, led)
            p.logger.log({"step": 0, **first_eval, **prefixed("compute", led.metrics())})
            log.info("step 0 | %s", format_eval(first_eval))
        last_eval = dict(first_eval or {})
        if snapshot_due(0):
            rt.save(0, first_eval=first_eval, last_eval=last_eval)

    bar = tqdm(
        total=d.total_steps, initial=start, dynamic_ncols=True,
        disable=not (cfg.logger.progress and p.lead),
    )  # fmt: skip
    stopped_at = None
    with logging_redirect_tqdm():
        for step in range(start, d.total_steps):
            x_before = eval_x(led)
            # Fresh rollouts (scored, advantages frozen): generated here (R/G prompts x G
            # samples under the sync schedule, the emulated arrivals under async), or what the
            # generator ranks delivered; the async ones may bring nothing at some steps.
            arrivals = rt.take(step, wait=len(p.buffer) == 0)
            add_arrivals(p, arrivals, step)
            while rt.can_wait and must_wait(cfg.buffer, p.buffer, step, arrivals, rt.whole_step):
                more = rt.take(step, wait=True)  # blocks for a generator's next delivery
                if not more:  # a generator died: stop_now tells every trainer
                    break
                add_arrivals(p, more, step)
                arrivals += more
            if rt.stop_now(step):  # a generator rank died: every trainer snapshots and stops
                stopped_at = step
                break
            # Sample a batch and update. With max_reuse under the async emulation the buffer
            # can run dry; the trainers then idle for this step (no update, compute charged).
            batch, stats, t0 = None, {}, time.perf_counter()
            if len(p.buffer):
                batch = p.buffer.sample(d.batch_per_trainer, step)
                check_versions(batch, step)
                stats = policy_update(
                    p.model, p.optimizer, batch, a, g.temperature, d.max_new_tokens, p.ref_model,
                    version=step, diagnostics=cfg.logger.diagnostics,
                    gap_known=g.backend == "hf" or g.store_trainer_logp,
                    signals=p.controller is not None,
                )  # fmt: skip
            if p.controller is not None:  # the step's signals into its window
                p.controller.observe(step, stats, arrivals, batch)
                stats.pop("control_rows", None)
            seconds = time.perf_counter() - t0 - stats.get("diag/seconds", 0.0)
            p.ledger.add_training(
                sequence_lengths(batch), stats.get("tokens", 0), seconds,
                extra_forwards=stats.pop("extra_forwards", 0),  # the ledger's, not a loss stat
            )  # fmt: skip
            p.ledger.add_data(trained=batch)

            # After the step: weights to the generators, log, evaluate on the grid, snapshot.
            version = step + 1
            led = rt.node_ledger()
            # controller=adaptive: every K steps it sets R, N (and lr) for the next steps; the
            # budget then ends the run, not a fixed step count.
            control = p.controller.decide(version, led, rt) if p.controller else None
            last = p.controller.last(version, led) if p.controller else version == d.total_steps
            is_eval = eval_due(x_before, eval_x(led)) or last
            rt.after_update(version, need_weights=is_eval or snapshot_due(version))
            is_log = log_due(version) or last or control is not None
            record = rt.gather_step(step_record(arrivals, batch)) if is_log or is_eval else None
            row: dict[str, Any] = {}
            if p.lead and is_log:
                row = {"step": version, "policy/version": version}
                row.update(step_metrics(record, stats))
                row.update(control or {})
            if p.lead and (is_log or is_eval):  # runtime/node_time is an eval row's x too
                row.update(rt.metrics(led))
                row.update(p.controller.metrics() if p.controller else {})  # the knobs now
            if p.lead and is_eval:
                comp = led.composition()  # cumulative, and over the interval since last eval
                since = interval_composition(comp, last_eval)
                last_eval = {**run_eval(cfg, d, p, rt, version, led), **comp, **since}
                write_telemetry(run_dir, version, collect_telemetry(record["buffers"]), p.logger)
                row.update({"step": version, **last_eval})
                log.info("step %d | %s", version, format_eval(last_eval))
            if row:
                row.update(led.composition())
                row.update(prefixed("compute", led.metrics()))
                p.logger.log(row)
            if snapshot_due(version):
                rt.save(version, first_eval=first_eval, last_eval=last_eval)
            bar.set_postfix(
                reward=f"{row.get('train/reward', float('nan')):.2f}",
                pass1=f"{last_eval.get('eval/pass@1', float('nan')):.3f}",
                refresh=False,
            )
            bar.update(1)
            if last:  # a controlled run's budget can end it before d.total_steps
                break
    bar.close()
    return finish(cfg, d, run_dir, p, rt, stopped_at, first_eval, last_eval, led)


def add_arrivals(p: Parts, arrivals: list[Arrival], step: int) -> None:
    """Charge each arrival's generation to the ledger and add it to the buffer (and warn, once,
    when most of them were cut off by the response budget: :func:`warn_if_truncated`)."""
    for fresh in arrivals:
        b, tokens = fresh.batch, int(fresh.batch.completion_mask_BxC.sum())
        p.ledger.add_generation(sequence_lengths(b), tokens, fresh.seconds)
        p.ledger.add_data(generated=b)
        p.buffer.add(b, step)  # buffer.max_staleness refuses (and counts) over-stale rows
    warn_if_truncated(p, arrivals, step)


TRUNCATED_WARN_FRACTION = 0.5  # warn when more than this share of fresh rollouts is cut off


def truncated_fraction(batch, budget: int, eos_id: int | None) -> float:
    """The share of ``batch``'s rollouts that used all ``budget`` completion tokens without
    emitting EOS (their answers, if any, were cut off)."""
    lengths_B = batch.completion_mask_BxC.sum(dim=1)
    full_B = lengths_B >= budget
    if eos_id is not None and batch.completion_ids_BxC.shape[1]:
        last_B = batch.completion_ids_BxC.gather(1, (lengths_B - 1).clamp(min=0)[:, None])[:, 0]
        full_B &= last_B != eos_id
    return float(full_B.float().mean()) if len(lengths_B) else 0.0


def warn_if_truncated(p: Parts, arrivals: list[Arrival], step: int) -> None:
    """One warning line per run (on the lead, from its own arrivals: the rollouts of the one
    process, or those a generator rank delivered to trainer rank 0) when more than half of a
    step's fresh rollouts hit the response budget without EOS: the silent zero-reward case,
    where the answer would have come after the cut and the reward reads cut-off text."""
    if p.truncation_warned or not p.lead or not p.response_budget or not arrivals:
        return
    batches = [a.batch for a in arrivals if len(a.batch)]
    n = sum(len(b) for b in batches)
    if not n:
        return
    eos_id = p.built.tokenizer.eos_token_id
    cut = sum(truncated_fraction(b, p.response_budget, eos_id) * len(b) for b in batches) / n
    if cut > TRUNCATED_WARN_FRACTION:
        p.truncation_warned = True
        log.warning(
            "step %d: %.0f%% of %d fresh completions hit the response budget of %d tokens "
            "without EOS (their answers may be cut off and score 0): raise "
            "generation.max_new_tokens (or task.max_response_tokens when it is null)",
            step, 100 * cut, n, p.response_budget,
        )  # fmt: skip


def interval_composition(now: dict[str, float], before: dict[str, Any]) -> dict[str, float]:
    """``data/interval/<kind>_<stat>``: the means over the rollouts generated (or samples
    trained) since ``before`` (the previous evaluation's row, which carries the cumulative
    ``data/*`` of ``Ledger.composition``; none before the first: since the start)."""
    out = {}
    for kind in ("generated", "trained"):
        n2, n1 = now[f"data/{kind}_count"], before.get(f"data/{kind}_count", 0)
        out[f"data/interval/{kind}_count"] = n2 - n1
        for stat in ("reward", "length", "pass_rate"):
            key = f"data/{kind}_{stat}"
            total2 = now[key] * n2 if n2 else 0.0
            total1 = before[key] * n1 if n1 else 0.0
            out[f"data/interval/{kind}_{stat}"] = (
                (total2 - total1) / (n2 - n1) if n2 > n1 else float("nan")
            )
    return out


def must_wait(bcfg, buffer, step: int, arrivals=(), whole_step: int = 0) -> bool:
    """Whether a trainer that can block for arrivals (``runtime=distributed``) must, before
    step ``step``: its buffer is empty, the step's ``arrivals`` hold fewer than
    ``whole_step`` rollouts (``runtime.lockstep``: the step's whole share), or
    (``buffer.staleness_policy=wait``) it holds no rollout within ``buffer.max_staleness``
    versions of the step."""
    if len(buffer) == 0:
        return True
    if whole_step and sum(len(a.batch.reward_B) for a in arrivals) < whole_step:
        return True
    if bcfg.staleness_policy != "wait":
        return False
    return step - buffer.newest_version() > bcfg.max_staleness


def check_versions(batch, step: int) -> None:
    """No rollout of a batch may come from weights newer than the trainer's (version step)."""
    newest = int(batch.version_B.max())
    if newest > step:
        raise RuntimeError(f"step {step}: a rollout of version {newest} is newer than the trainer")


def run_eval(cfg, d: Derived, p: Parts, rt: Runtime, step: int, led: Ledger) -> dict[str, float]:
    """Evaluate the current policy (version ``step``) on the held-out split (the lead)."""
    t0 = time.perf_counter()
    with rt.paused():  # the node stands still while it is evaluated
        generator, model = rt.evaluator(step)
        out, details = evaluate(
            generator, model, p.built.tokenizer, p.built.task, p.eval_problems, cfg.eval,
            d.max_new_tokens, derive_seed(cfg.seed, "eval", step), chat=p.built.chat,
            micro_batch_size=cfg.algo.micro_batch_size,
        )  # fmt: skip
    p.ledger.add_eval(time.perf_counter() - t0)
    x = {"compute/paper_units": led.paper_units, "compute/rollouts": led.rollouts}
    p.details_log.write({"step": step, **x, **encode_details(details)})
    return {f"eval/{k}": v for k, v in out.items()}


def step_record(arrivals: list[Arrival], batch) -> dict[str, Any]:
    """This process's part of a step's training row (gathered over trainer ranks)."""
    fresh = [f.batch for f in arrivals]
    return {
        "reward": torch.cat([b.reward_B for b in fresh]) if fresh else None,
        "response_len": torch.cat([b.completion_mask_BxC.sum(1) for b in fresh]) if fresh else None,
        "batch_reward": None if batch is None else batch.reward_B,
        "batch_version_max": -1 if batch is None else int(batch.version_B.max()),
        "generation": next((f.stats for f in arrivals if f.stats), {}),
    }


def step_metrics(record: dict[str, Any], stats: dict[str, Any]) -> dict[str, Any]:
    """The training row of one step from the gathered records (rank 0's update stats)."""
    nan = float("nan")

    def mean(key: str) -> float:
        parts = [r[key] for r in record["ranks"] if r[key] is not None]
        return float(torch.cat(parts).float().mean()) if parts else nan

    ranks = record["ranks"]
    fresh = sum(0 if r["reward"] is None else len(r["reward"]) for r in ranks)
    return {
        "train/reward": mean("reward"),
        "train/fresh_rollouts": fresh,
        "train/response_len": mean("response_len"),
        "train/batch_reward": mean("batch_reward"),
        # the newest policy version in any trainer's batch (<= step - 1 = this step)
        "train/batch_version_max": max(r["batch_version_max"] for r in ranks),
        **update_metrics(stats),
        **prefixed("buffer", collect_stats(record["buffers"])),
        **prefixed("generation", ranks[0]["generation"]),
    }


def finish(cfg, d, run_dir, p: Parts, rt: Runtime, stopped_at, first_eval, last_eval, led):
    """After the last step (or a stop): drain what is still in flight, account for every
    rollout, write the summary; the final model if ``save_final_model``."""
    measured = rt.metrics(led)  # reuse and rates over the training steps
    final_step = stopped_at
    if stopped_at is None:  # a controlled run (in process) ends where its budget did
        final_step = d.total_steps if p.controller is None else p.ledger.steps
    if stopped_at is not None:
        rt.save(stopped_at, first_eval=first_eval, last_eval=last_eval)
    ended = rt.finish(final_step, partial(add_arrivals, p))  # gathered on the lead; a collective
    led = rt.node_ledger()
    final_model = rt.final_model() if cfg.save_final_model and stopped_at is None else None
    if not p.lead:
        return None
    if stopped_at is not None:
        p.logger.close({"status": "stopped", "step": stopped_at})
        raise RunStopped(ended["stopped"])
    telemetry = collect_telemetry(ended["buffers"])
    write_telemetry(run_dir, final_step, telemetry, None)
    summary = {
        "status": "finished",
        "steps": final_step,
        "initial": first_eval,
        "final": last_eval,
        "compute": led.metrics(),
        "runtime": {
            **account(ended),
            **{
                k.removeprefix("runtime/"): v
                for k, v in measured.items()
                if k.startswith("runtime/")
            },
            "off_policiness_hist": telemetry["off_policiness"],
            # each generator process's counters (runtime/generator.py; [] in one process)
            "generators": ended["generators"],
        },
        # the code of each start and resume (config.yaml's records; runlog.code_provenance)
        "provenance": read_provenance(run_dir) or [code_provenance()],
    }
    p.logger.close(summary)
    p.details_log.close()
    rt.close()
    if final_model is not None:  # the master weights, or cast to model.save_dtype
        save_dtype = cfg.model.save_dtype or d.param_dtype
        final_model.to(DTYPES[save_dtype]).save_pretrained(run_dir / "final_model")
        p.built.tokenizer.save_pretrained(run_dir / "final_model")
    # Last and atomic: "finished" means everything above is on disk (relaunches skip the run).
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    log.info("done: %s", format_eval(last_eval))
    return summary
