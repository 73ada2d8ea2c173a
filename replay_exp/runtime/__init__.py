"""``runtime=distributed``: one experiment as W generator processes and T data-parallel
trainer processes on torch.distributed (the paper's node, for real, beside the in-process
emulation of ``schedule=async``).

- ``launch``: a local spawn or the tasks of one SLURM job; rendezvous, supervision.
- ``generator``: a generator rank's loop (generate, score, send; take weights between calls).
- ``trainer``: a trainer rank's loop (its buffer shard, DDP or FSDP updates; rank 0 logs,
  evaluates, snapshots and pushes weights).
- ``channels``: the point-to-point messages and the heartbeats.
"""

from replay_exp.runtime.launch import RankFailed, join_slurm, run_distributed, slurm_rank

__all__ = ["RankFailed", "join_slurm", "run_distributed", "slurm_rank"]
