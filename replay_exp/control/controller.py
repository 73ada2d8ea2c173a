"""The closed-loop replay controller: every ``controller.every`` steps it reads the window's
training-side signals and sets the knobs it owns (``controller.knobs``: ``reuse`` = R,
``capacity`` = N, ``lr`` = a scale of ``algo.lr``), by its policy (``controller.policy``:
``guard`` or ``model``; ``docs/controller.md``).

What it touches, all in the one loop (``replay_exp.loop``):

- **arrivals** (``schedule=sync`` only): the in-process runtime asks it how many prompt groups
  step s generates (``groups_at``) and how many came before (``groups_before``, for unique
  rollout ids). Under ``schedule=async`` (the in-process emulation and ``runtime=distributed``)
  R emerges from W, T and mu, so it owns only N and the lr (resolve refuses ``reuse``); its R
  is the run's own, rounded to whole groups (what the design model scores an async split as);
- **the buffer**: ``set_capacity(N)`` (FIFO; shrinking evicts the oldest at once); under
  ``runtime=distributed`` each trainer rank's shard holds N / T;
- **the optimizer**: each parameter group's ``lr`` = ``algo.lr`` x the scale;
- **the budget**: with R changing, the step count is no longer fixed; ``last`` says whether
  the next step at the current R would overrun the budget. A fixed run's step count
  (``derive_steps``) spends its budget at the nominal (B + mu R) / (B (1 + mu)) a step, so the
  controller counts the same nominal units (``spent``): one that never moves takes exactly the
  fixed run's steps. (The ledger charges what each step really trained, as for any run: less
  while the buffer holds fewer than B rollouts.)

Under ``runtime=distributed`` every trainer rank holds a controller; a decision is made once,
on rank 0, from the window of every rank (``Window.merged``), and its state is broadcast, so
every rank sets the same knobs (``runtime.check_replicas`` compares them after every step).
The runtime gives the collective (``rt.gather``, ``rt.broadcast``; one process: itself).

Its state (knobs, rung, groups generated, the open window, the policy's memory) is in the
snapshot, under the rollout source's state (each trainer rank's own under
``runtime=distributed``), so a resumed run continues bit for bit.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from replay_exp.compute import costmodel
from replay_exp.config.seeding import derive_seed
from replay_exp.control import guard
from replay_exp.control import model as model_policy
from replay_exp.control.hysteresis import HysteresisState, gate
from replay_exp.control.ladder import Knobs, Ladder
from replay_exp.control.lr import lr_scale
from replay_exp.control.signals import Window

log = logging.getLogger("replay_exp")


class Controller:
    """One run's controller (module docstring). ``buffer`` and ``optimizer`` are the ones it
    sets; ``d`` the derived sizes (the start design, and the most the buffer may hold)."""

    def __init__(self, cfg: Any, d: Any, buffer: Any, optimizer: torch.optim.Optimizer):
        c, s = cfg.controller, cfg.schedule
        self.c, self.s, self.seed = c, s, cfg.seed
        self.B, self.G, self.mu = s.batch_size, cfg.algo.group_size, cfg.compute.mu
        self.mu_schedule = costmodel.as_schedule(cfg.compute.mu_schedule)  # sync only
        self.base_lr = cfg.algo.lr
        self.max_steps = d.total_steps  # the bound resolve() derived at the cheapest step
        # schedule=sync: it sets R (the arrivals); async: R emerges (whole groups, as scored)
        self.sets_arrivals = s.name == "sync"
        R0 = int(d.rollouts_per_step)
        if not self.sets_arrivals:
            R0 = max(self.G, self.G * round(d.rollouts_per_step / self.G))
        self.async_units = d.paper_units_per_step  # an async step's nominal cost (fixed)
        self.shards = d.trainers if cfg.runtime.name == "distributed" else 1  # N / T a rank
        self.R_min = c.min_rollouts_per_step or self.G
        self.N_max = d.max_capacity
        self.ladder = Ladder(
            R0, d.capacity, self.B, self.G, self.R_min, self.N_max,
            c.reuse_growth, c.capacity_growth, owns_reuse="reuse" in c.knobs,
            owns_capacity="capacity" in c.knobs,
        )  # fmt: skip
        self.buffer, self.optimizer = buffer, optimizer
        self.rung = self.ladder.start
        self.knobs = self.ladder.knobs(self.rung)
        self.groups_done = 0
        self.spent = 0.0  # nominal paper units of the steps taken (the budget's, see above)
        self.decisions = 0
        self.moves = {"up": 0, "down": 0}  # decisions that moved to more / less reuse
        self.window = Window()
        self.guard = guard.GuardState()
        self.hysteresis = HysteresisState()
        self.apply()

    # -- arrivals (the in-process runtime's schedule) -----------------------------------------
    def groups_at(self, step: int) -> int:
        return self.knobs.rollouts_per_step // self.G

    def groups_before(self, step: int) -> int:
        return self.groups_done

    # -- the loop's calls ---------------------------------------------------------------------
    def observe(self, step: int, stats: dict[str, Any], arrivals: list, batch: Any) -> None:
        """After the update of ``step``: its signals into the window (``stats`` still holds
        ``control_rows``), and the groups it generated into the count."""
        fresh = [a.batch.reward_B for a in arrivals]
        self.groups_done += sum(len(r) for r in fresh) // self.G
        self.spent += self.step_units(self.knobs.rollouts_per_step)
        fresh_reward = float(torch.cat(fresh).float().mean()) if fresh else math.nan
        trained = float(batch.reward_B.float().mean()) if batch is not None else math.nan
        self.window.add(step, stats, fresh_reward, trained)

    def decide(self, version: int, led: Any, rt: Any) -> dict[str, float] | None:
        """At a decision step (every ``controller.every`` versions): read the window (every
        trainer rank's, gathered by ``rt``), set the knobs, log why; the ``controller/*``
        values of the row (None between decisions). A collective under
        ``runtime=distributed``: rank 0 decides, every rank loads its state."""
        if version % self.c.every:
            return None
        windows = rt.gather(self.window)  # [each rank's]; None off the lead
        out = state = None
        if windows is not None:
            window = Window.merged(windows)
            if len(window):
                out = self._decide(version, led, window)
                state = self.state_dict()
        out, state = rt.broadcast((out, state))
        if windows is None and state is not None:  # a rank that did not decide: as rank 0
            self.load_state_dict(state)
        return out

    def _decide(self, version: int, led: Any, window: Window) -> dict[str, float]:
        summary = window.summary()
        before = (self.knobs.rollouts_per_step, self.knobs.capacity)
        if self.c.policy == "guard":
            move, reason, inputs = guard.decide(summary, self.guard, self.c.guard)
            self.rung = self.ladder.clamp(self.rung + move)
            R, N = self.ladder.rungs[self.rung]
        else:
            (N, R), reason, inputs = self._model_decision(version, window.rows)
            # the rung of a design on the ladder; None: the model jumped off it
            self.rung = self.ladder.rungs.index((R, N)) if (R, N) in self.ladder.rungs else None
        c = self.c
        lr = (lr_scale(c.lr_rule, summary["ess"], summary["lag"], c.lr_min_scale, c.lr_lag_scale)
              if "lr" in c.knobs else 1.0)  # fmt: skip
        self.knobs = Knobs(R, N, lr)
        self.apply()
        self.decisions += 1
        self.window = Window()
        action = np.sign(before[0] - R) if before[0] != R else np.sign(N - before[1])
        if action:
            self.moves["up" if action > 0 else "down"] += 1
        log.info(
            "controller at step %d: R %d -> %d, N %d -> %d, lr x %.3g (%s)",
            version, before[0], R, before[1], N, lr, reason,
        )  # fmt: skip
        row = {
            "action": float(action),
            **{f"in/{k}": v for k, v in summary.items()},
            "in/budget_left": self.budget_left(led),
            "in/mu": self.mu_now(),  # the generation cost it decided at
            "in/measured_mu": led.metrics().get("measured_mu", math.nan),
            **inputs,
        }
        return {f"controller/{k}": v for k, v in {**row, **self._knob_values()}.items()}

    def metrics(self) -> dict[str, float]:
        """The knobs now and the decisions so far, on every logged and evaluated row
        (``controller/*``)."""
        return {f"controller/{k}": v for k, v in self._knob_values().items()}

    def last(self, version: int, led: Any) -> bool:
        """Whether ``version`` is the run's last: the next step at the current R would overrun
        the budget (steps, rollouts or paper units), or the bound of resolve() is reached."""
        s, R = self.s, self.knobs.rollouts_per_step
        if version >= self.max_steps or not self.sets_arrivals:  # async: the fixed count
            return version >= self.max_steps
        if s.max_steps is not None:
            return version >= s.max_steps
        if s.max_rollouts is not None:
            return led.rollouts + R > s.max_rollouts + 1e-6
        return self.spent + self.step_units(R) > s.max_compute * (1 + 1e-9)

    def step_units(self, R: int) -> float:
        """The next step's nominal paper units at R: (B + mu_t R) / (B (1 + mu)) under sync
        (mu_t: the cost in force, :meth:`mu_now`), the split's fixed gamma under async."""
        if not self.sets_arrivals:
            return self.async_units
        return costmodel.scheduled_step_units(self.B, R, self.mu, self.mu_schedule, self.spent)

    def mu_now(self) -> float:
        """The generation cost in force for the next step (``compute.mu_schedule`` at the
        units spent; ``compute.mu`` without one): what the design model scores with, as a
        controller on a real node would read it from the generators' timing."""
        return costmodel.mu_in_force(self.mu, self.mu_schedule, self.spent)

    def budget_left(self, led: Any) -> float:
        """What is left of the budget, in its own unit (compute: nominal units, above)."""
        s = self.s
        if s.max_steps is not None:
            return float(s.max_steps - led.steps)
        if s.max_rollouts is not None:
            return float(s.max_rollouts - led.rollouts)
        return float(s.max_compute - self.spent)

    # -- internals ------------------------------------------------------------------------------
    def apply(self) -> None:
        """Set the buffer's capacity (this rank's shard's: N / T) and the optimizer's learning
        rate to the knobs."""
        self.buffer.set_capacity(self.knobs.capacity // self.shards)
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * self.knobs.lr_scale

    def _knob_values(self) -> dict[str, float]:
        R, N = self.knobs.rollouts_per_step, self.knobs.capacity
        return {
            "rollouts_per_step": float(R), "reuse_ratio": self.B / R, "capacity": float(N),
            "horizon": N / R, "lr_scale": self.knobs.lr_scale,
            "decisions": float(self.decisions), "moves_up": float(self.moves["up"]),
            "moves_down": float(self.moves["down"]), "held": float(self.hysteresis.held),
            # rungs above the start (0: the config's own design); NaN: off the ladder
            "rung": math.nan if self.rung is None else float(self.rung - self.ladder.start),
        }  # fmt: skip

    def _model_decision(self, version: int, rows: list) -> tuple:
        m = self.c.model
        rng = np.random.default_rng(derive_seed(self.seed, "controller", version))
        alpha, lo, hi, aged = model_policy.estimate_alpha(rows, rng, m.bootstrap)
        current = (self.knobs.capacity, self.knobs.rollouts_per_step)
        inputs = {"in/alpha": alpha, "in/alpha_lo": lo, "in/alpha_hi": hi,
                  "in/aged_rows": float(aged), "in/gain": math.nan,
                  "identified": math.nan}  # fmt: skip
        if aged < m.min_aged_rows or not math.isfinite(alpha):
            up = self.ladder.above(self.knobs)
            if up is None:
                return current, f"probe: {aged} aged rows, already at the top: hold", inputs
            self.rung = up
            R, N = self.ladder.rungs[up]
            return (N, R), f"probe: {aged} aged rows < {m.min_aged_rows}: one rung up", inputs
        # The budget in on-policy steps at the cost in force (the same sample units): what
        # the design model's candidates are bounded by.
        mu = self.mu_now()
        budget = self.s.max_compute * (1 + self.mu) / (1 + mu)
        target, identified, reason, gain = model_policy.pick_design(
            current, self.B, self.G, mu, budget,
            model_policy.load_rho(m.noise), alpha, lo, hi, m.model, self.R_min, self.N_max,
            fixed_R=not self.sets_arrivals,
        )  # fmt: skip
        inputs["identified"], inputs["in/gain"] = float(identified), gain
        chosen, held = gate(current, target, gain, self.hysteresis, m.min_gain, m.persist)
        reason = f"alpha {alpha:.3g} [{lo:.3g}, {hi:.3g}]: {reason}" + (f"; {held}" if held else "")
        return chosen, reason, inputs

    # -- snapshot -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "knobs": self.knobs.state_dict(),
            "rung": self.rung,
            "groups_done": self.groups_done,
            "spent": self.spent,
            "decisions": self.decisions,
            "moves": dict(self.moves),
            "window": self.window.state_dict(),
            "guard": {
                "streak": self.guard.streak,
                "grad_sum": self.guard.grad_sum,
                "grad_windows": self.guard.grad_windows,
            },  # fmt: skip
            "hysteresis": self.hysteresis.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.knobs = Knobs.from_state(state["knobs"])
        self.rung = None if state["rung"] is None else int(state["rung"])
        self.groups_done = int(state["groups_done"])
        self.spent = float(state["spent"])
        self.decisions = int(state["decisions"])
        self.moves = {k: int(v) for k, v in state["moves"].items()}
        self.window.load_state_dict(state["window"])
        g = state["guard"]
        self.guard = guard.GuardState(int(g["streak"]), float(g["grad_sum"]),
                                      int(g["grad_windows"]))  # fmt: skip
        self.hysteresis = HysteresisState.from_state(state.get("hysteresis"))
        self.apply()
