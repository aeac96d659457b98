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
    """One layer carries exactly the keys of the variant's own mask (the chance over draws for one that draws)."""
    one = reach_by_distance(name, 64, 16, 1, trials=4)
    assert one[0] == 1.0 and ((one >= 0) & (one <= 1)).all()
    if not get_variant(name).draws:
        from sa_lightning.attention import AttentionSpec, masks

        row = masks.dense(get_variant(name).mask(AttentionSpec(name, window=16), 64, None), 64)[0, 0, 63]
        assert one.tolist() == row.flip(0).double().tolist()
