"""Where the loop's rollouts come from, and what trainer processes share (``base``): in this
process (``inprocess``: ``runtime=inprocess``), or W generator processes and T data-parallel
trainer processes on torch.distributed (``runtime=distributed``: the paper's node, for real,
beside the in-process emulation of ``schedule=async``).

- ``base``: the interface the loop (``replay_exp.loop``) asks of a runtime.
- ``inprocess``: generation in the training process (sync, or the emulated node's arrivals).
- ``accounting``: the rollout balance, the merged ledger and the reuse metrics of both.
- ``launch``: a local spawn or the tasks of one SLURM job; rendezvous, supervision.
- ``generator``: a generator rank's loop (generate, score, send; take weights between calls).
- ``trainer``: a trainer rank's source (its inbox) and collectives (DDP or FSDP, gathers on
  rank 0, which also pushes the weights); the loop itself is ``replay_exp.loop``.
- ``channels``: the point-to-point messages and the heartbeats.
- ``process``: what every training process sets first (threads, ``deterministic``).
"""

# Nothing imported here: the loop imports base and accounting without the launcher.
