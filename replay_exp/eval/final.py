"""pass@k up to large k for finished runs: the final policy re-evaluated with more samples.

    python -m replay_exp.eval.final RUN_DIR [RUN_DIR ...] [--n-samples 32]
        [--pass-k 1 2 4 8 16 32] [--problems N] [--threads 1] [--force]

During training a run samples ``eval.n_samples`` responses per held-out problem (4 in the tiny
studies, so pass@k stops at k = 4). This loads the run's ``final_model`` (written by finished
runs with ``save_final_model``, the default) and evaluates it once more
(``replay_exp.eval.evaluate.evaluate``, the same code as the run's evaluations) with ``--n-samples``
samples per problem on the first ``--problems`` held-out problems (default: the run's
``eval.sampled_problems``; 0 = all), everything else as the run evaluated: its task, its prompt
fitting, response length, chat template and ``eval.sample_temperature`` / ``sample_top_p``.
The sampling seed is ``derive_seed(seed, "final_passk")`` of the run's seed.

It writes ``RUN_DIR/final_passk.json`` (atomically): the settings, the metrics (``pass@1``
greedy on every held-out problem, ``pass@k_sampled`` for each k, ``sample_reward``, ...) and the
per-problem correct counts, which ``python -m replay_exp.analysis.studies.passk`` turns into paired
intervals against the baseline. A run whose file already has these settings is skipped
(``--force`` redoes it). A directory that is not a finished run, or a k above n, is a one-line
error before any model is loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import OmegaConf

from replay_exp.checkpoint import atomic_write_text
from replay_exp.config.seeding import derive_seed
from replay_exp.eval.estimators import encode_details
from replay_exp.eval.evaluate import evaluate
from replay_exp.models.build import build_evaluator, build_policy

OUT_NAME = "final_passk.json"


class EvalError(ValueError):
    """Bad input (printed as one line)."""


def settings(cfg: Any, n_samples: int, pass_k: list[int], problems: int | None) -> dict:
    """What the evaluation depends on besides the weights (stored with the result; a file with
    the same settings is not redone)."""
    if n_samples < 1:
        raise EvalError(f"--n-samples must be >= 1, got {n_samples}")
    bad = [k for k in pass_k if not 1 <= k <= n_samples]
    if bad:
        raise EvalError(f"--pass-k {bad} outside 1..--n-samples={n_samples}")
    if problems is None:
        problems = cfg.eval.get("sampled_problems") or 0
    return {
        "n_samples": n_samples,
        "pass_k": sorted(set(pass_k)),
        "sampled_problems": int(problems) or None,
        "sample_temperature": float(cfg.eval.sample_temperature),
        "sample_top_p": float(cfg.eval.sample_top_p),
        "seed": derive_seed(int(cfg.seed), "final_passk"),
    }


def check_run(run_dir: Path) -> Any:
    """The run's saved config, after checking it is a finished run with a final model."""
    cfg_path, model = run_dir / "config.yaml", run_dir / "final_model"
    if not cfg_path.is_file():
        raise EvalError(f"{run_dir}: no config.yaml (not a run directory)")
    if not (run_dir / "summary.json").is_file() or not model.is_dir():
        raise EvalError(
            f"{run_dir}: no final_model (the run is unfinished, or ran with save_final_model=false)"
        )
    return OmegaConf.create(cfg_path.read_text())


def evaluate_run(run_dir: Path, cfg: Any, spec: dict) -> dict:
    """Load ``run_dir/final_model`` and evaluate it with ``spec`` (:func:`settings`)."""
    d = cfg.derived
    built = build_policy(cfg, d, weights_dir=run_dir / "final_model")
    policy = built.policy.eval()
    problems = built.task.eval_problems()[: cfg.eval.n_problems]
    ecfg = OmegaConf.merge(cfg.eval, {
        "n_samples": spec["n_samples"], "pass_k": spec["pass_k"],
        "sampled_problems": spec["sampled_problems"],
    })  # fmt: skip
    evaluator = build_evaluator(cfg.generation, policy, built.tokenizer)  # as the run's own
    metrics, details = evaluate(
        evaluator, policy, built.tokenizer, built.task, problems, ecfg, d.max_new_tokens,
        spec["seed"], chat=built.chat, micro_batch_size=cfg.algo.micro_batch_size,
    )  # fmt: skip
    return {"settings": spec, "metrics": metrics, **encode_details(details)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m replay_exp.eval.final", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("run_dirs", nargs="+", type=Path)
    p.add_argument("--n-samples", type=int, default=32)
    p.add_argument("--pass-k", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--problems", type=int, default=None,
                   help="held-out problems sampled (default: the run's eval.sampled_problems; "
                        "0 = all)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--force", action="store_true", help="redo runs already evaluated")
    args = p.parse_args(argv)
    try:  # every input checked before any model is loaded
        jobs = []
        for run_dir in args.run_dirs:
            cfg = check_run(run_dir)
            jobs.append((run_dir, cfg, settings(cfg, args.n_samples, args.pass_k, args.problems)))
    except EvalError as e:
        print(f"evaluate_final: {e}", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(args.threads)
    transformers.utils.logging.disable_progress_bar()
    for run_dir, cfg, spec in jobs:
        out = run_dir / OUT_NAME
        if (not args.force and out.is_file()
                and json.loads(out.read_text()).get("settings") == spec):  # fmt: skip
            print(f"{out}: already evaluated with these settings; skipped")
            continue
        result = evaluate_run(run_dir, cfg, spec)
        atomic_write_text(out, json.dumps(result))
        shown = "  ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items())
        print(f"{out}: {shown}")


if __name__ == "__main__":
    main()
