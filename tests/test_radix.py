"""The radix control's pattern: within SA's budget, the fewest layers to reach the whole row, and that reach shown by
the mask itself (its kernel against the oracle is ``test_variant_registry``'s, on every backend)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from sa_lightning.analysis.mechanism import reach_by_distance
from sa_lightning.attention.masks import sa_band_others
from sa_lightning.attention.radix import radix_bases, radix_layers, radix_offsets


def fewest_digits(n: int, window: int) -> int | None:
    """By brute force: the fewest digits of any bases whose product reaches n within the budget."""
    budget = sa_band_others(window)
    for digits in range(1, budget + 1):
        for bases in itertools.combinations_with_replacement(range(2, budget + 2), digits):
            if sum(bases) - digits <= budget and math.prod(bases) >= n:
                return digits
    return None


@pytest.mark.parametrize("n,window", [(20, 8), (64, 8), (100, 6), (128, 16), (256, 16), (512, 16), (300, 4)])
def test_the_bases_stay_in_sas_budget_and_take_the_fewest_layers(n, window):
    bases, offsets = radix_bases(n, window), radix_offsets(n, window)
    assert sum(b - 1 for b in bases) <= sa_band_others(window)
    assert len(offsets) <= sa_band_others(window) and all(0 < o < n for o in offsets)
    assert radix_layers(n, window) == fewest_digits(n, window)


def test_the_known_cases():
    assert radix_bases(256, 16) == (4, 4, 4, 4)  # 12 keys reach 256 in 4 layers (the design notes' b = 4, L = 4)
    assert radix_offsets(256, 16) == (1, 2, 3, 4, 8, 12, 16, 32, 48, 64, 128, 192)
    assert radix_layers(128, 16) == 3 and radix_layers(512, 16) == 5
    assert radix_bases(8, 16) == (8,)  # the band holds the row: causal attention
    assert radix_layers(10 ** 6, 3) is None  # one key: reaches only what 2^1 does


@pytest.mark.parametrize("n,window", [(128, 16), (256, 16), (200, 12)])
def test_its_mask_reaches_every_distance_in_its_layers_and_not_in_one_fewer(n, window):
    layers = radix_layers(n, window)
    assert bool((reach_by_distance("radix", n, window, layers)[1:] == 1).all())
    assert bool((reach_by_distance("radix", n, window, layers - 1)[1:] < 1).any())


def test_a_padded_row_reads_its_own_lengths_offsets():
    from sa_lightning.attention import masks

    mod = masks.radix(16, 256, torch.tensor([256, 100]))
    dense = masks.dense(mod, 256, batch=2)[:, 0]
    i = 99
    assert set((i - dense[1, i, :i + 1].nonzero().view(-1)).tolist()) == {0, *radix_offsets(100, 16)}
    assert set((i - dense[0, i, :i + 1].nonzero().view(-1)).tolist()) == {0, *[o for o in radix_offsets(256, 16)
                                                                              if o <= i]}
