"""A control must be able to win: before it stands against SA, its own mask must carry a task's answer from the key
to the query through the model's layers. Strided alone cannot (it reads only multiples of its stride, at any depth);
Strided+local (a local band beside the strides) reaches every earlier token within the layers it states, at SA's
kernel cost; SA, fixed-σ SA and the random keys reach past SWA's field in four layers at the deciding cell."""
from __future__ import annotations

import pytest

from sa_lightning.analysis.mechanism import PATTERNED, reach_by_distance, reach_share
from sa_lightning.attention import get_variant
from sa_lightning.attention.masks import sa_band_others
from sa_lightning.attention.strided_local import local_stride

N, W, L = 128, 16, 4  # the deciding passkey cell (configs/study/long_range.yaml, preset decide-l4)
FIELD = L * (W - 1)


def _offsets(h: int, s: int, n: int, hops: int) -> set[int]:
    """The offsets a query reaches in ``hops`` layers of the pattern, by set arithmetic on offsets alone."""
    one = {d for d in range(n) if d <= h or d % s == 0}
    reached = {0}
    for _ in range(hops):
        reached = {a + b for a in reached for b in one if a + b < n}
    return reached


@pytest.mark.parametrize("n, w", [(128, 16), (128, 32), (512, 32), (96, 16), (40, 16), (300, 7)])
def test_strided_local_reaches_every_earlier_token_in_the_layers_it_states_at_sas_kernel_cost(n, w):
    h, s, layers = local_stride(n, w)
    assert h + 1 + (n - 1) // s <= sa_band_others(w) + 1  # the last query computes no more keys than SA's band
    assert _offsets(h, s, n, layers) == set(range(n))
    if layers > 1:
        assert _offsets(h, s, n, layers - 1) != set(range(n))  # and it needs them all


def test_at_the_deciding_cell_the_controls_that_stand_against_sa_reach_past_the_field():
    for name in ("sa", "sa_fixed", "random", "strided_local"):
        assert reach_share(name, N, W, L, FIELD + 1, trials=8) >= 0.99, name
    assert reach_share("swa", N, W, L, FIELD + 1) == 0.0  # the floor reaches nothing there
    strided = reach_by_distance("strided", N, W, L)
    assert [d for d in range(FIELD + 1, N) if strided[d] > 0] == [70, 80, 90, 100, 110, 120]  # multiples of s = 10
    assert reach_share("strided", N, W, L, FIELD + 1) < 0.11


@pytest.mark.parametrize("name", [v for v in PATTERNED if get_variant(v).sparse])
def test_every_patterned_variant_reaches_what_its_mask_allows_in_one_layer(name):
    """One layer carries exactly the keys of the variant's own mask (the chance over draws for one that draws), as a
    model of one layer runs it (the deterministic controls tune their pattern for that depth)."""
    one = reach_by_distance(name, 64, 16, 1, trials=4)
    assert one[0] == 1.0 and ((one >= 0) & (one <= 1)).all()
    if not get_variant(name).draws:
        from sa_lightning.attention import AttentionSpec, masks

        row = masks.dense(get_variant(name).mask(AttentionSpec(name, window=16, depth=1), 64, None), 64)[0, 0, 63]
        assert one.tolist() == row.flip(0).double().tolist()


# ---- (h, s) tuned for the model's depth (``AttentionSpec.depth``, issue 76) --------------------------------------
@pytest.mark.parametrize("n", [40, 96, 128, 256, 512])
@pytest.mark.parametrize("w", [8, 16, 32])
@pytest.mark.parametrize("depth", [1, 2, 3, 4, 6])
def test_the_tuned_stride_is_todays_where_that_reaches_within_the_depth_and_reaches_no_less_elsewhere(n, w, depth):
    from sa_lightning.attention.strided_local import reached_pairs

    today, tuned = local_stride(n, w), local_stride(n, w, depth)
    h, s, layers = tuned
    assert h + 1 + (n - 1) // s <= sa_band_others(w) + 1  # SA's kernel cost, never more
    if today[2] <= depth:
        assert tuned == today
    else:
        assert reached_pairs(n, h, s, depth) >= reached_pairs(n, today[0], today[1], depth)
        assert _offsets(h, s, n, layers) == set(range(n))  # its own layers are what it states
        assert layers == 1 or _offsets(h, s, n, layers - 1) != set(range(n))


def test_the_tuned_stride_reaches_more_where_the_model_has_fewer_layers():
    from sa_lightning.attention.strided_local import reached_pairs

    assert local_stride(128, 16, 4) == local_stride(128, 16)  # Table 15's cell: the pattern it always ran
    assert local_stride(256, 16)[:2] == (5, 26) and local_stride(256, 16, 4)[:2] == (7, 32)
    assert reached_pairs(256, 7, 32, 4) > reached_pairs(256, 5, 26, 4)  # 25113 against 22230 of 32896 pairs
    for n, depth in ((256, 2), (256, 3), (512, 2), (512, 3), (512, 4)):
        (h, s, _), (h0, s0, _) = local_stride(n, 16, depth), local_stride(n, 16)
        assert reached_pairs(n, h, s, depth) > reached_pairs(n, h0, s0, depth), (n, depth)


@pytest.mark.parametrize("n, w, depth", [(96, 16, 2), (100, 8, 3), (60, 5, 1), (256, 16, 4), (150, 12, 2)])
def test_the_tuned_stride_is_the_best_of_every_pair_within_the_budget(n, w, depth):
    """Against brute force over every (h, s) whose last query computes no more than SA's band, each pair's reach by
    set arithmetic on its offsets (``_offsets``), not the closed form."""
    weight = lambda reached: sum(n - d for d in reached)  # noqa: E731 (the row holds n - d pairs d apart)
    budget = sa_band_others(w) + 1
    best = max(weight(_offsets(h, s, n, depth)) for h in range(1, budget) for s in range(h + 1, n + 1)
               if h + 1 + (n - 1) // s <= budget)
    h, s, _ = local_stride(n, w, depth)
    assert weight(_offsets(h, s, n, depth)) == best


@pytest.mark.parametrize("n, w, depth", [(96, 16, 2), (256, 16, 4), (256, 16, 2), (100, 8, 3), (512, 16, 3)])
def test_the_closed_form_reach_is_the_masks_own_by_boolean_matrix_powers(n, w, depth):
    from sa_lightning.attention.strided_local import reached, reached_pairs
    from tests.test_radix import _pairs_by_matrix_powers

    h, s, _ = local_stride(n, w, depth)
    assert reached_pairs(n, h, s, depth) == _pairs_by_matrix_powers("strided_local", n, w, depth)
    assert set(reached(n, h, s, depth).nonzero().view(-1).tolist()) == _offsets(h, s, n, depth)


def test_reach_builds_each_control_at_the_depth_it_analyzes():
    """``analyze reach`` and ``study reach`` stack L layers of the pattern a model of L layers runs: at n = 256 and
    L = 4 Strided+local's tuned (h, s) reach further past the field than the fewest-layers pair (61.0%)."""
    tuned = reach_share("strided_local", 256, 16, 4, 4 * 15 + 1)
    assert tuned > 0.62
    h, s, _ = local_stride(256, 16, 4)
    from sa_lightning.attention.strided_local import reached

    assert tuned == pytest.approx(float(reached(256, h, s, 4)[4 * 15 + 1:].double().mean()))


def test_a_reach_cell_of_a_control_whose_pattern_changed_is_measured_again(tmp_path):
    from sa_lightning.experiments.reach import EXPERIMENT

    cfg = EXPERIMENT.load("configs/study/reach.yaml", "tuned-n512")
    specs = {c["variant"]: EXPERIMENT.spec(c, cfg, tmp_path) for c in EXPERIMENT.cells(cfg) if c["depth"] == 4}
    assert specs["strided_local"]["revision"] == specs["radix"]["revision"] == 2
    assert "revision" not in specs["sa"] and specs["sa"]["n"] == 512
