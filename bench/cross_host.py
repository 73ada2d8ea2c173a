"""What crossing a host boundary costs the distributed runtime (run by hand, as root).

    python bench/cross_host.py [--steps 60] [--reps 3] [--out FILE.json] [--smoke]

The embedded default under ``runtime=distributed runtime.lockstep=true buffer=on_policy``,
W = 1 generator and T = 1 trainer (B = 64, one push and one batch of rollouts per step, no
evaluation but the last, threads=1 per process), run alternately on one host (the local spawn)
and on the two emulated hosts of scripts/two_hosts.sh (trainer on host b, generator on host a,
started under torchrun's variables): ``--reps`` pairs, in the order one, two, one, two, ...
Lockstep makes every step the same work in both placements (the same rollouts, bit for bit),
so the difference is the link: per step the trainer waits for the generator to take the push
(the weights, ~0.6 M floats here), generate and send its batch back; crossing the link adds
the push's and the batch's transfer to that wait.

Per run: steps per second over the training loop (the last row's ``runtime/steps_per_second``),
the trainer's wait per step (``runtime/wait_seconds`` / steps), the generator's seconds per
weight load (its ``weight_load_seconds`` / ``weight_loads``: receiving and loading a push).
Medians over the reps, side by side, and two hosts / one host.

The emulated link is a veth pair (in the kernel, like the loopback): this measures what the
runtime adds by crossing a network namespace (addresses, connections, another gloo pair), not
a real network's latency or bandwidth. Without root or ``ip netns`` it measures one host and
says SKIP for the other. ``--smoke`` (3 steps, one pair, 8 held-out problems) only checks that
it all runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "scripts" / "two_hosts.sh"
ENV = {**os.environ, "TWO_HOSTS_PREFIX": f"rb{os.getpid() % 10000}-",
       "TWO_HOSTS_NET": f"10.232.{os.getpid() % 250}", "HYDRA_FULL_ERROR": "0"}  # fmt: skip
COMMON = [
    "runtime=distributed", "runtime.lockstep=true", "buffer=on_policy", "schedule=async",
    "schedule.gpus=null", "schedule.workers=1", "schedule.trainers=1", "buffer.shards=1",
    "schedule.max_compute=null", "eval.at_start=false", "eval.unit=steps",
    "logger.progress=false", "threads=1", "checkpoint.every=null",
]  # fmt: skip


def _harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HARNESS), *args], env=ENV, capture_output=True, text=True)


def _measure(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    last = [r for r in rows if "runtime/steps_per_second" in r][-1]
    gen = summary["runtime"]["generators"][0]
    return {
        "steps_per_s": last["runtime/steps_per_second"],
        "wait_ms_per_step": 1e3 * last["runtime/wait_seconds"] / summary["steps"],
        "load_ms": 1e3 * gen["weight_load_seconds"] / max(1, gen["weight_loads"]),
    }


def one_host(args: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "replay_exp.train", *COMMON, *args, f"run_dir={run_dir}"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    return _measure(run_dir)


def two_hosts(args: list[str], run_dir: Path, port: int) -> dict:
    cmd = [sys.executable, "-m", "replay_exp.train", *COMMON, *args, f"run_dir={run_dir}"]
    procs = []
    for rank, host in enumerate("ba"):
        env = [f"RANK={rank}", "WORLD_SIZE=2", "MASTER_ADDR=host-b", f"MASTER_PORT={port}"]
        procs.append(subprocess.Popen([str(HARNESS), "exec", host, "env", *env, *cmd], env=ENV,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
        if rank == 0:
            time.sleep(1.0)  # rank 0 takes the run's lock first
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        err = procs[0].stderr.read()[-3000:]
        raise SystemExit(f"failed across hosts (exit codes {codes}): {err}")
    return _measure(run_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    steps, reps = (3, 1) if a.smoke else (a.steps, a.reps)
    args = [f"schedule.max_steps={steps}", f"eval.every={steps}"]
    if a.smoke:
        args += ["task.n_eval=8", "eval.sampled_problems=8"]
    check = _harness("check")
    can_cross = check.returncode == 0
    results: dict[str, list[dict]] = {"one host": [], "two hosts": []}
    with tempfile.TemporaryDirectory() as tmp:
        if can_cross:
            _harness("up")
        try:
            for i in range(reps):
                results["one host"].append(one_host(args, Path(tmp) / f"one_{i}"))
                if can_cross:
                    run = Path(tmp) / f"two_{i}"
                    results["two hosts"].append(two_hosts(args, run, 29700 + i))
        finally:
            if can_cross:
                _harness("down")
    print(f"lockstep, W = 1, T = 1, {steps} steps, median of {reps}")
    print("| hosts | steps/s | trainer wait ms/step | generator ms/weight load |")
    print("|---|---|---|---|")
    med = {}
    for name, runs in results.items():
        if not runs:
            print(f"| {name} | SKIP: {check.stdout.strip()} | | |")
            continue
        med[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        m = med[name]
        print(f"| {name} | {m['steps_per_s']:.2f} | {m['wait_ms_per_step']:.1f} | "
              f"{m['load_ms']:.2f} |")  # fmt: skip
    if len(med) == 2:
        one, two = med["one host"], med["two hosts"]
        print(f"| two / one | {two['steps_per_s'] / one['steps_per_s']:.3f} | "
              f"{two['wait_ms_per_step'] / one['wait_ms_per_step']:.3f} | "
              f"{two['load_ms'] / one['load_ms']:.3f} |")  # fmt: skip
    if a.out:
        a.out.write_text(json.dumps({"steps": steps, "reps": reps, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
