"""The compute ledger: every logged row carries cumulative totals in three currencies.

1. Paper units (Arnal et al.): a step that trains on B_t samples and generates R_t rollouts
   costs (B_t + mu R_t) forward-backward sample units. We normalise by one on-policy step at
   the configured batch size, B (1 + mu), so the on-policy baseline costs exactly 1 per step and
   a replay step with reuse ratio y = B/R costs (1 + mu / y) / (1 + mu). Under the async-cluster
   emulation every step is charged gamma = (1 + W/T) / (1 + mu) exactly, the cost of the whole
   node for one trainer step (``units_per_step``). ``compute.mu`` is taken
   from the config (the paper measured 6.84 for Qwen3-0.6B and 5.28 for Qwen2.5-7B on GPUs).
   Under ``compute.mu_schedule`` a step's generation is charged at the mu in force when it
   starts (``costmodel.mu_in_force`` at the budget's count of the steps before it,
   :meth:`Ledger.budget_units`), still normalised by the reference ``compute.mu``.
2. Analytic FLOPs: forward = 2 N T + 2 L d T^2 for a sequence of T real tokens (N = parameters
   that do matmul work per token: everything but the input embedding, plus the tied output
   head; the attention term counts QK^T and AV under a causal mask). Generation with a KV
   cache costs one forward over prompt + completion; a training step costs 3 forwards
   (forward + backward). Padding is not counted.
3. Measured wall seconds for generation, training and evaluation, and the mu they imply:
   (seconds per generated rollout) / (seconds per trained sample).

Beside the compute, what it bought: the composition of the generated and of the trained data
(sums of reward and of the group's pass rate at generation, per rollout generated and per
sample trained; mean lengths are ``gen_tokens / rollouts`` and ``train_tokens /
samples_trained``), logged as ``data/*`` (``composition``): a stale-data policy that starves
hard or long problems shows as trained means above the generated ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from replay_exp.compute import costmodel


def flop_params(model: torch.nn.Module) -> int:
    """Parameters that cost 2 FLOPs per token in a forward pass (see module docstring)."""
    emb = model.get_input_embeddings().weight
    n = sum(p.numel() for p in model.parameters() if p is not emb)
    tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is emb
    return n + (emb.numel() if tied else 0)


def attention_width(config) -> int:
    """What QK^T and AV contract over per layer: query heads x head dim. The hidden size for
    Llama and Qwen2; twice it for Qwen3-0.6B (16 heads x 128, hidden 1024)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_attention_heads * head_dim


def sequence_lengths(batch) -> torch.Tensor:
    """Real tokens (prompt + completion) per rollout of a RolloutBatch (none for None)."""
    if batch is None:
        return torch.zeros(0, dtype=torch.long)
    return batch.prompt_mask_BxP.sum(1) + batch.completion_mask_BxC.sum(1)


def forward_flops(n_params: int, n_layers: int, hidden: int, lengths: torch.Tensor) -> float:
    """Analytic forward FLOPs of sequences with the given real-token ``lengths``; ``hidden``:
    the attention width (:func:`attention_width`)."""
    T = lengths.double()
    return float((2 * n_params * T + 2 * n_layers * hidden * T * T).sum())


@dataclass
class Ledger:
    mu: float
    batch_size: int  # B of the config: normalises paper units
    n_params: int
    n_layers: int
    hidden: int  # the attention width (attention_width: heads x head_dim)
    units_per_step: float | None = None  # fixed paper units per step (async: gamma)
    mu_schedule: tuple | None = None  # compute.mu_schedule: (from units, mu) pairs
    steps: int = 0
    rollouts: int = 0  # unique rollouts generated
    samples_trained: int = 0  # rollouts trained on, repeats included
    gen_tokens: int = 0  # completion tokens generated
    train_tokens: int = 0  # completion tokens trained on (loss tokens)
    sample_units: float = 0.0  # sum of (B_t + mu R_t)
    gen_units: float = 0.0  # its generation part, sum of mu_t R_t (mu_t: the mu in force)
    paper_units: float = 0.0  # sample_units / (B (1 + mu))
    flops_gen: float = 0.0
    flops_train: float = 0.0
    seconds_gen: float = 0.0
    seconds_train: float = 0.0
    seconds_eval: float = 0.0
    extra_forwards: int = 0  # no-grad whole-batch forwards of the update (proximal, M2PO)
    reward_gen_sum: float = 0.0  # sum of rewards of the rollouts generated
    pass_gen_sum: float = 0.0  # sum of their group's mean reward at generation
    reward_train_sum: float = 0.0  # sum of rewards of the samples trained (repeats included)
    pass_train_sum: float = 0.0  # sum of their group's mean reward at generation

    def add_generation(self, lengths: torch.Tensor, gen_tokens: int, seconds: float) -> None:
        """``lengths``: prompt + completion real tokens per generated rollout."""
        self.rollouts += len(lengths)
        self.gen_tokens += gen_tokens
        units = costmodel.sample_units(0, len(lengths), self.mu_now())
        self.sample_units += units
        self.gen_units += units
        self.flops_gen += forward_flops(self.n_params, self.n_layers, self.hidden, lengths)
        self.seconds_gen += seconds
        self._normalise()

    def add_training(
        self, lengths: torch.Tensor, loss_tokens: int, seconds: float, extra_forwards: int = 0
    ) -> None:
        """``lengths``: prompt + completion real tokens per trained sample; ``extra_forwards``:
        no-grad forwards of the whole batch the update ran besides its forward + backward
        (``algo.proximal=recompute``; M2PO micro-batched), charged one forward each."""
        self.steps += 1
        self.samples_trained += len(lengths)
        self.train_tokens += loss_tokens
        self.sample_units += costmodel.sample_units(len(lengths), 0, self.mu)
        flops = forward_flops(self.n_params, self.n_layers, self.hidden, lengths)
        self.flops_train += (3 + extra_forwards) * flops
        self.extra_forwards += extra_forwards
        self.seconds_train += seconds
        self._normalise()

    def budget_units(self) -> float:
        """The steps so far as the budget counts them (``derive_steps``, the controller's
        ``spent``): B trained a step, whatever the buffer held, plus the generation charged,
        in paper units."""
        return costmodel.paper_units(self.batch_size * self.steps + self.gen_units, self.mu,
                                     self.batch_size)  # fmt: skip

    def mu_now(self) -> float:
        """The generation cost in force for the next step (``compute.mu`` without a schedule)."""
        if not self.mu_schedule:
            return self.mu
        return costmodel.mu_in_force(self.mu, self.mu_schedule, self.budget_units())

    def add_eval(self, seconds: float) -> None:
        self.seconds_eval += seconds

    def _normalise(self) -> None:
        if self.units_per_step is not None:
            self.paper_units = self.steps * self.units_per_step
        else:
            self.paper_units = costmodel.paper_units(self.sample_units, self.mu, self.batch_size)

    def measured_mu(self) -> float | None:
        if not (self.rollouts and self.samples_trained and self.seconds_train > 0):
            return None
        per_rollout = self.seconds_gen / self.rollouts
        per_sample = self.seconds_train / self.samples_trained
        return per_rollout / per_sample

    def add_data(self, generated=None, trained=None) -> None:
        """Add RolloutBatches to the composition sums: ``generated`` (arrivals) and/or
        ``trained`` (a training batch, each sampled row once per use)."""
        if generated is not None:
            self.reward_gen_sum += float(generated.reward_B.double().sum())
            self.pass_gen_sum += float(generated.group_reward_B.double().sum())
        if trained is not None:
            self.reward_train_sum += float(trained.reward_B.double().sum())
            self.pass_train_sum += float(trained.group_reward_B.double().sum())

    def composition(self) -> dict[str, float]:
        """``data/{generated,trained}_{count,reward,length,pass_rate}``: cumulative counts and
        means (NaN before the first); a mean over an interval is (m2 n2 - m1 n1) / (n2 - n1)."""
        nan = float("nan")
        out = {}
        for kind, n, reward, tokens, passed in (
            ("generated", self.rollouts, self.reward_gen_sum, self.gen_tokens, self.pass_gen_sum),
            ("trained", self.samples_trained, self.reward_train_sum, self.train_tokens,
             self.pass_train_sum),
        ):  # fmt: skip
            out[f"data/{kind}_count"] = n
            out[f"data/{kind}_reward"] = reward / n if n else nan
            out[f"data/{kind}_length"] = tokens / n if n else nan
            out[f"data/{kind}_pass_rate"] = passed / n if n else nan
        return out

    def metrics(self) -> dict[str, float]:
        hidden = ("mu", "batch_size", "n_params", "n_layers", "hidden", "units_per_step",
                  "mu_schedule", "gen_units", "reward_gen_sum", "pass_gen_sum", "reward_train_sum",
                  "pass_train_sum")  # fmt: skip
        out = {k: v for k, v in asdict(self).items() if k not in hidden}
        out["flops"] = self.flops_gen + self.flops_train
        out["seconds"] = self.seconds_gen + self.seconds_train + self.seconds_eval
        mu = self.measured_mu()
        if mu is not None:
            out["measured_mu"] = mu
        if self.mu_schedule:
            out["mu"] = self.mu_now()  # compute/mu: the cost charged from here on
        return out

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
