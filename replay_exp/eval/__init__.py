"""Held-out evaluation: ``evaluate`` (pass@1, pass@k, entropy during training), ``final``
(pass@k up to large k on finished runs) and ``estimators`` (torch-free: the analysis uses
it). Importing the package imports none of them."""
