"""The config: Hydra composition, validation, derived sizes, run naming.

Each module does one job; importing the package imports none of them (import from the module:
``from replay_exp.config.composition import compose``, ``from replay_exp.config.derive import
resolve``), so the light ones (``errors``, ``schemas``, ``seeding``) stay usable by the
torch-free analysis and by the modules that ``checks`` validates against.

- ``schemas``: one typed dataclass per Hydra group option, registered in ConfigStore.
- ``composition``: ``compose(overrides)``, the same composition as ``python -m replay_exp.train``
  (and its ``model=<dir or hub id>`` shorthand).
- ``derive``: ``resolve(cfg) -> (cfg, Derived)``: the checklist of checks, then every derived
  size (the pure ``derive_*`` functions, tested with numbers).
- ``checks``: the checks ``resolve()`` runs, one function per group.
- ``probe``: the only I/O of ``resolve``: a local model's config and tokenizer, the task data.
- ``naming``: run and sweep directory names (the Hydra resolvers of ``conf/train.yaml``).
- ``errors``: ``ConfigError`` (one line naming keys and values) and ``RunStopped``.
- ``seeding``: the seeds of the random streams.
- ``sweep``: a multirun's progress (a Hydra callback and ``python -m replay_exp.config.sweep``).
"""
