"""Hand-pinned numbers for group-relative advantages."""

from __future__ import annotations

import pytest
import torch

from replay_exp.algo import group_advantages


def test_two_groups_of_two():
    # rewards [1,0 | 0,1], G=2. Group 0: mean 0.5, population std sqrt((0.25+0.25)/2) = 0.5
    # -> A = (+0.5, -0.5) / (0.5 + 1e-6) = +-0.999998000004. Group 1 mirrors it.
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    a = 0.5 / (0.5 + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a]), rtol=0, atol=1e-7)


def test_population_std_not_sample_std():
    # [1,0,0,0], G=4, eps=0: mean 0.25, centred [0.75,-0.25,-0.25,-0.25],
    # population var = (0.5625 + 3*0.0625)/4 = 0.1875, std = 0.4330127
    # -> A = [0.75/0.4330127, -0.25/0.4330127, ...] = [sqrt(3), -1/sqrt(3) x3]
    # (sample std, ddof=1, would be sqrt(0.75/3) = 0.5 -> [1.5, -0.5, ...]).
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, eps=0.0)
    s3 = 3.0**0.5
    torch.testing.assert_close(adv, torch.tensor([s3, -1 / s3, -1 / s3, -1 / s3]))


def test_sample_std_with_trls_eps():
    # std="sample" (verl's torch.std, TRL's nanstd): the same group [1,0,0,0], ddof 1 ->
    # var 0.75 / 3 = 0.25, std 0.5; TRL's eps 1e-4: A = [0.75 / 0.5001, -0.25 / 0.5001 x3] =
    # [1.4997001, -0.4999000 x3]. An all-equal group stays exactly 0, and a group of one (no
    # sample std) is all-equal too: 0, not nan.
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(r, group_size=4, eps=1e-4, std="sample")
    b = -0.25 / 0.5001
    torch.testing.assert_close(adv, torch.tensor([0.75 / 0.5001, b, b, b, 0, 0, 0, 0]))
    assert torch.equal(group_advantages(torch.tensor([1.0, 0.0]), 1, std="sample"), torch.zeros(2))
    with pytest.raises(ValueError, match="unknown std 'ddof1'"):
        group_advantages(r, 4, std="ddof1")


def test_no_std_normalisation_is_just_centring():
    # [1,0,0,0] and [2,2,4,0], G=4: means 0.25 and 2 -> [0.75,-0.25,-0.25,-0.25], [0,0,2,-2]
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 4.0, 0.0])
    adv = group_advantages(r, group_size=4, normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 2.0, -2.0]))


@pytest.mark.parametrize(("normalize_std", "eps"), [(True, 1e-6), (True, 0.0), (False, 1e-6)])
def test_equal_rewards_give_exactly_zero(normalize_std, eps):
    # Groups [0.1]*3 and [1]*3 have std 0: with eps=0 the plain formula is 0/0 = nan, and any
    # rounding residue of r - mean would be blown up by the division; both must give exactly 0.
    # Group [0,1,1] is not degenerate: mean 2/3 -> A[6] < 0 < A[7].
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    adv = group_advantages(r, group_size=3, normalize_std=normalize_std, eps=eps)
    assert torch.equal(adv[:6], torch.zeros(6))
    assert adv[6] < 0 < adv[7]


def test_output_is_float32_for_other_input_dtypes():
    # int64 rewards [1,0], G=2 -> +-0.5/(0.5+1e-6), returned as float32
    adv = group_advantages(torch.tensor([1, 0]), group_size=2)
    assert adv.dtype == torch.float32
    assert adv[0].item() == pytest.approx(0.999998, abs=1e-6)
    assert group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), 2).dtype == torch.float32


def test_batch_not_multiple_of_group_raises():
    with pytest.raises(ValueError, match="B=5 is not a multiple of group_size G=2"):
        group_advantages(torch.zeros(5), group_size=2)
