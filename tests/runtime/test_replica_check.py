"""The per-step check of runtime=distributed's trainer ranks (runtime/trainer.py): the DDP
replicas' weights and the knobs controller=adaptive set must agree on every rank."""

from __future__ import annotations

import pytest

from replay_exp.runtime.trainer import check_replicas_agree


def test_equal_ranks_pass():
    check_replicas_agree([(7, None), (7, None)], 3)
    knobs = (24, 256, 1.0, 128, (3e-5,))
    check_replicas_agree([(7, knobs), (7, knobs)], 3)


def test_differing_weights_raise():
    with pytest.raises(RuntimeError, match="version 3: trainer replicas differ"):
        check_replicas_agree([(7, None), (8, None)], 3)


def test_differing_knobs_raise_naming_them():
    a, b = (24, 64, 1.0, 32, (3e-5,)), (24, 256, 1.0, 128, (3e-5,))
    with pytest.raises(RuntimeError, match=r"version 5: the trainer ranks' controller knobs "
                       r"differ .*\(24, 64, 1.0, 32, \(3e-05,\)\), \(24, 256"):  # fmt: skip
        check_replicas_agree([(None, a), (None, b)], 5)
