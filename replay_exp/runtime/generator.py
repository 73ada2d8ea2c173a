"""A generator rank: generate, score and send rollouts, forever, picking up weights between
calls. One per inference worker (W of them).

    while not stopped:
        take the newest weights pushed by trainer rank 0, if any (never mid-generation);
            modelled cost with runtime.cost_model.load_cost: the load lasts that many trained
            samples' time
        wait while trainer rank 0 evaluates or snapshots (the node stands still)
        prompts = the next groups_per_batch problems of this generator's own stream
        rollouts = generate G samples each, rewards, advantages frozen, behaviour log-probs
        runtime.generation_cost=modelled: wait until the call has lasted what a GPU node
            would spend on it (replay_exp/compute/gencost.py)
        send each prompt group to its trainer's buffer shard (global group id mod T)

Batch ``j`` of generator ``w`` (w = 0..W-1) holds the global prompt groups
``(j W + w) P .. (j W + w) P + P - 1`` (P = groups per batch), so group ids and rollout uids
are unique over the run, and its prompts and sampling seeds are ``derive_seed(seed,
"prompts"|"gen", w, j)``: a relaunch regenerates exactly the batches that were in flight.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from replay_exp.checkpoint import read_snapshot
from replay_exp.compute import gencost
from replay_exp.compute.lengthmodel import quantile_level
from replay_exp.config.seeding import derive_seed
from replay_exp.models import load_policy
from replay_exp.rollout import SamplingParams, engine_model_dir, make_generator
from replay_exp.rollout.collect import generate_rollouts, prompt_lengths, with_trainer_logp
from replay_exp.runtime.channels import (
    STOP,
    Heartbeat,
    RolloutSender,
    WeightReceiver,
    flatten,
    unflatten_into,
    weight_keys,
)
from replay_exp.tasks import make_task
from replay_exp.types import RolloutBatch

log = logging.getLogger("replay_exp")


def run_generator(
    cfg, d, rank: int, store, links, run_dir: Path, snapshot_path: str | None
) -> dict:
    """The loop of generator rank ``rank`` (global rank T + w), talking to the trainers over
    ``links`` (channels.open_links) and the store. Returns its counters."""
    T, W = d.trainers, d.workers
    w = rank - T
    a, g = cfg.algo, cfg.generation
    heartbeat = Heartbeat(store, rank)
    # The snapshot first: the trainers wait for this key before their first step, since two
    # saves later they prune it (a generator that starts slowly, e.g. importing vLLM, would
    # otherwise find it gone).
    snap = read_snapshot(snapshot_path) if snapshot_path is not None else None
    store.set(snapshot_read_key(w), "1")
    task = make_task(cfg.task)
    policy, tokenizer, source = load_policy(cfg.model, cfg.task, task, d.device, d.dtype)
    policy.eval()
    chat = bool(cfg.model.chat_template)
    task.fit_prompts(partial(prompt_lengths, tokenizer, chat=chat), d.max_prompt_len)
    keys = weight_keys(policy.state_dict())

    version, j, sent_base = 0, 0, dict.fromkeys(range(T), 0)
    if snap is not None:  # start from the snapshot's weights and counters
        policy.load_state_dict(snap.states["policy"])
        state = snap.trainer["runtime"]
        version, j = snap.step, int(state["next_batch"][str(w)])
        sent_base = {t: int(state["received"][str(t)][str(w)]) for t in range(T)}
    # hf samples this process's own module; vllm runs an engine fed from it at every push.
    model_dir = engine_model_dir(cfg, source, policy, tokenizer, run_dir / f"generator_model_{w}")
    generator = make_generator(
        g, policy, tokenizer, share_weights=g.backend == "hf", model_dir=model_dir,
        max_model_len=d.max_prompt_len + d.max_new_tokens, dtype=d.dtype,
        seed=derive_seed(cfg.seed, "engine", w), device=d.device,
    )  # fmt: skip
    generator.sync_weights(policy, version)
    sampling = SamplingParams(g.temperature, g.top_p, d.max_new_tokens)
    P, G = d.groups_per_batch, a.group_size
    numel = flatten(policy.state_dict(), keys).numel()
    weights = WeightReceiver(store, links, w, numel, policy.dtype)
    sender = RolloutSender(store, links, w, list(range(T)), cfg.runtime.max_in_flight)
    counters = {"batches": 0, "rollouts": 0, "weight_updates": 0, "gen_seconds": 0.0,
                "slept_seconds": 0.0, "overruns": 0, "weight_loads": 0, "weight_load_seconds": 0.0,
                "engine_checks": 0, "engine_logp_absdiff_max": 0.0,
                "engine_logp_absdiff_mean": 0.0, "engine_versions_checked": 0,
                "modelled_units": 0.0, "modelled_per_sample": 0.0,
                "paused_seconds": 0.0}  # fmt: skip
    checked: set[int] = set()  # versions whose engine log-probs were checked
    absdiff_sum = 0.0  # of the checked calls' mean |engine - pushed weights| log-prob
    modelled = cfg.runtime.generation_cost == "modelled"
    cost = gencost.ModelledCost(cfg.compute.mu, cfg.runtime.cost_model.length_sigma)
    reference = cfg.runtime.cost_model.reference_s_per_sample
    load_cost = cfg.runtime.cost_model.load_cost
    calibrated = None  # this generator's own estimate, until the trainers publish theirs
    log.info("generator %d (rank %d): %d groups of %d per call, from version %d", w, rank, P, G,
             version)  # fmt: skip
    while True:
        news, t_load, loaded = weights.poll(), time.perf_counter(), False
        while news is not None:  # the newest push wins
            new_version, flat = news
            if new_version == STOP:
                break
            unflatten_into(policy, flat, keys)
            generator.sync_weights(policy, new_version)
            counters["weight_updates"] += 1
            loaded = True
            news = weights.poll()
        if loaded and modelled and load_cost > 0:  # a GPU node's weight load (gencost.py), once
            # per take: pushes that arrive during the pause wait for the next call, as they
            # would on a node (pausing per push would livelock once a load outlasts a step)
            pause = load_cost * (reference or gencost.published_seconds(store) or 0.0)
            time.sleep(max(0.0, pause - (time.perf_counter() - t_load)))
        if loaded:
            counters["weight_loads"] += 1
            counters["weight_load_seconds"] += time.perf_counter() - t_load
        if news is not None and news[0] == STOP:
            break
        counters["paused_seconds"] += wait_while_paused(store)  # an evaluation or snapshot
        first_group = (j * W + w) * P
        rng = np.random.default_rng(derive_seed(cfg.seed, "prompts", w, j))
        prompts = task.sample_train(rng, P)
        t0 = time.perf_counter()
        fresh = generate_rollouts(
            generator, tokenizer, task, prompts, G, sampling,
            seed=derive_seed(cfg.seed, "gen", w, j), step=generator.version,
            first_uid=first_group * G, first_group=first_group,
            normalize_std=a.adv_normalize_std, chat=chat,
        )  # fmt: skip
        if cfg.generation.store_trainer_logp:  # the engine mismatch, at the generating weights
            fresh, check = with_trainer_logp(
                policy, fresh, cfg.generation.temperature, "gap", a.micro_batch_size
            )
            # The engine against this process's copy of the policy, which holds exactly the
            # weights trainer rank 0 pushed for generator.version: the push landed in the
            # engine iff they agree (to the engine's own rounding).
            absdiff_sum += check["behaviour_logp_absdiff_mean"]
            counters["engine_logp_absdiff_max"] = max(
                counters["engine_logp_absdiff_max"], check["behaviour_logp_absdiff_max"]
            )
            counters["engine_checks"] += 1
            checked.add(generator.version)
        seconds = time.perf_counter() - t0
        if modelled:  # sleep until the batch has taken what a GPU node would spend on it
            per_sample = reference or gencost.published_seconds(store)
            if per_sample is None:
                if calibrated is None:
                    calibrated = gencost.time_training(
                        policy, fresh, g.temperature, a.micro_batch_size
                    )
                per_sample = calibrated
            u = quantile_level(cfg.seed, w, j)
            elapsed = time.perf_counter() - t0  # the generation (and a first calibration)
            seconds, own = cost.next_call(len(fresh), u, per_sample, elapsed)  # revalued
            if seconds > elapsed:
                time.sleep(seconds - elapsed)
                counters["slept_seconds"] += seconds - elapsed
            if elapsed > own:  # the real generation outlasted the call's own model
                counters["overruns"] += 1
            counters["modelled_units"], counters["modelled_per_sample"] = cost.units, per_sample
        counters["gen_seconds"] += seconds
        for t, part in split_by_trainer(fresh, T):
            payload = {"batch": batch_to_dict(part), "generator": w, "j": j,
                       "seconds": seconds * len(part) / len(fresh)}  # fmt: skip
            sender.send(t, payload, len(part))
        counters["batches"] += 1
        counters["rollouts"] += len(fresh)
        j += 1
    counters["stall_seconds"] = sender.stall_seconds
    counters["engine_logp_absdiff_mean"] = absdiff_sum / max(1, counters["engine_checks"])
    counters["engine_versions_checked"] = len(checked)
    # Published before DONE, so trainer rank 0 finds it when it sees DONE (summary.json's
    # runtime.generators; this launch's counts only after a resume).
    store.set(report_key(w), json.dumps(counters))
    sender.close({t: sent_base[t] + sender.sent[t] for t in range(T)})
    if hasattr(generator, "close"):
        generator.close()
    heartbeat.stop()
    log.info("generator %d done: %s", w, counters)
    return counters


# Store key trainer rank 0 sets to "1" while it evaluates or snapshots (the node stands still:
# no generator starts a call) and back to "0" after.
PAUSE_KEY = "node/paused"


def wait_while_paused(store, poll: float = 0.02) -> float:
    """Block while the node is paused (``PAUSE_KEY``); the seconds waited. Polled every
    ``poll`` seconds: fast polling by W generators would take CPU from the evaluation they
    wait for on a small machine (not measured), and 20 ms is small beside a generator call."""
    t0 = time.perf_counter()
    while store.check([PAUSE_KEY]) and store.get(PAUSE_KEY) == b"1":
        time.sleep(poll)
    return time.perf_counter() - t0


def snapshot_read_key(w: int) -> str:
    """Store key set once generator ``w`` holds its copy of the snapshot it resumes from."""
    return f"snapshot_read/{w}"


def report_key(w: int) -> str:
    """Store key of generator ``w``'s final counters (JSON)."""
    return f"generator_report/{w}"


def split_by_trainer(batch: RolloutBatch, T: int) -> list[tuple[int, RolloutBatch]]:
    """The rows of each trainer's prompt groups (group id mod T), for the trainers that get
    any."""
    owner = batch.group_id_B % T
    out = []
    for t in range(T):
        rows = torch.nonzero(owner == t).flatten()
        if len(rows):
            out.append((t, batch.index(rows)))
    return out


def batch_to_dict(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in vars(batch).items()}


def batch_from_dict(d: dict[str, torch.Tensor]) -> RolloutBatch:
    return RolloutBatch(**d)
