"""The radix control's pattern: within SA's budget, the fewest layers to reach the whole row, and that reach shown by
the mask itself (its kernel against the oracle is ``test_variant_registry``'s, on every backend)."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from sa_lightning.analysis.mechanism import reach_by_distance
from sa_lightning.attention.masks import sa_band_others
from sa_lightning.attention.radix import radix_bases, radix_layers, radix_mask, radix_offsets


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

    mod = radix_mask(16, 256, torch.tensor([256, 100]))
    dense = masks.dense(mod, 256, batch=2)[:, 0]
    i = 99
    assert set((i - dense[1, i, :i + 1].nonzero().view(-1)).tolist()) == {0, *radix_offsets(100, 16)}
    assert set((i - dense[0, i, :i + 1].nonzero().view(-1)).tolist()) == {0, *[o for o in radix_offsets(256, 16)
                                                                              if o <= i]}


# ---- the bases tuned for the model's depth (``AttentionSpec.depth``, issue 76) -----------------------------------
def _pairs_by_matrix_powers(variant: str, n: int, window: int, depth: int) -> int:
    """The (query, key) pairs j <= i that ``depth`` layers of the variant's own mask at that depth connect, by boolean
    matrix powers of the dense mask: nothing of ``radix``'s or ``strided_local``'s reach arithmetic is used."""
    from sa_lightning.attention import AttentionSpec, get_variant, masks

    spec = AttentionSpec(variant, window=window, depth=depth)
    step = masks.dense(get_variant(variant).mask(spec, n, None), n)[0, 0].double()
    reach = torch.eye(n, dtype=torch.float64)
    for _ in range(depth):
        reach = ((reach @ step) > 0).double()
    return int(reach.sum())


@pytest.mark.parametrize("n", [20, 64, 100, 128, 256, 512])
@pytest.mark.parametrize("window", [8, 16])
@pytest.mark.parametrize("depth", [1, 2, 3, 4, 5, 6])
def test_the_tuned_bases_are_todays_where_those_reach_within_the_depth_and_reach_no_less_elsewhere(n, window, depth):
    from sa_lightning.attention.radix import offsets_of, reached_pairs

    today, tuned = radix_bases(n, window), radix_bases(n, window, depth)
    assert sum(b - 1 for b in tuned) <= sa_band_others(window)  # SA's budget, never more
    assert len(radix_offsets(n, window, depth)) <= sa_band_others(window)
    if math.prod(today) >= n and len(today) <= depth:
        assert tuned == today and radix_offsets(n, window, depth) == radix_offsets(n, window)
    else:
        assert reached_pairs(offsets_of(tuned, n), n, depth) >= reached_pairs(offsets_of(today, n), n, depth)


def test_the_tuned_bases_reach_more_where_the_model_has_fewer_layers_than_digits():
    from sa_lightning.attention.radix import reached_pairs

    assert radix_bases(128, 16, 4) == (6, 5, 5)  # Table 15's n = 128, L = 4: unchanged, it reaches in 3
    assert radix_bases(256, 16, 4) == (4, 4, 4, 4)  # the map's n = 256, L = 4: unchanged, it reaches in 4
    for n, depth in ((256, 2), (256, 3), (512, 2), (512, 3), (512, 4)):
        more, fewest = radix_offsets(n, 16, depth), radix_offsets(n, 16)
        assert reached_pairs(more, n, depth) > reached_pairs(fewest, n, depth), (n, depth)
    assert radix_bases(512, 16, 4) == (5, 4, 4, 4, 2)  # 98.4% of the row's pairs in 4 layers (the fewest: 92.1%)


@pytest.mark.parametrize("n, window, depth", [(100, 8, 2), (64, 6, 3), (90, 8, 1)])
def test_the_tuned_bases_are_the_best_of_every_set_of_bases_within_the_budget(n, window, depth):
    """Against brute force over every multiset of bases (largest first) that SA's budget holds."""
    from sa_lightning.attention.radix import offsets_of, reached_pairs

    budget = sa_band_others(window)
    best = max(reached_pairs(offsets_of(tuple(sorted(bases, reverse=True)), n), n, depth)
               for digits in range(1, budget + 1)
               for bases in itertools.combinations_with_replacement(range(2, budget + 2), digits)
               if sum(bases) - digits <= budget)
    assert reached_pairs(radix_offsets(n, window, depth), n, depth) == best


@pytest.mark.parametrize("n, window, depth", [(100, 16, 2), (256, 16, 2), (256, 16, 3), (200, 12, 2), (64, 8, 1)])
def test_the_bitset_reach_is_the_masks_own_by_boolean_matrix_powers(n, window, depth):
    from sa_lightning.attention.radix import reached_pairs

    assert reached_pairs(radix_offsets(n, window, depth), n, depth) == _pairs_by_matrix_powers("radix", n, window,
                                                                                                depth)


def test_a_padded_row_reads_its_own_lengths_offsets_at_the_depth():
    from sa_lightning.attention import masks

    dense = masks.dense(radix_mask(16, 256, torch.tensor([256, 100]), depth=2), 256, batch=2)[:, 0]
    i = 99
    assert set((i - dense[1, i, :i + 1].nonzero().view(-1)).tolist()) == {0, *radix_offsets(100, 16, 2)}
    assert radix_offsets(100, 16, 2) != radix_offsets(100, 16)  # the depth changed this row's pattern


def test_a_depth_below_one_is_refused_in_one_sentence():
    from sa_lightning.attention import AttentionSpec

    with pytest.raises(ValueError, match="depth must be an integer >= 1, got 0"):
        AttentionSpec("radix", window=16, depth=0)
    with pytest.raises(ValueError, match="depth must be an integer >= 1"):
        radix_bases(512, 16, 0)
