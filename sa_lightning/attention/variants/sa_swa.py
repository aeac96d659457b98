"""Gated SA+SWA (the paper's model): two paths, SA and SWA, on the same q, k, v, mixed by output gates that
the model learns. Training-free use needs the gates, so a Hugging Face model runs ``sa_swa_union`` instead."""
from __future__ import annotations

from .. import masks
from ..band_common import fused_forward_applies
from ..band_inplace import Band, multi_band_attention
from ..registry import Variant
from . import sa, swa
from ._common import check_permutation, draw_permutation, union_keys, union_mask


def kernel(call):
    """Both paths, (y_sa, y_swa), each exactly what SA's and SWA's own kernels give.

    The paths share q, k and v, so on the banded backend with gradients (training on CPU) both bands run in one
    pass (``multi_band_attention``): one gather of queries and one of keys and values in slot order feed both
    softmaxes, and no key window is copied. On CPU, forward and backward cost 1.96x one SWA call at n=8192, w=256
    (two bands are twice the matmuls of one; SWA and SA alone run the same in-place kernel with one band). Every
    other case (FlexAttention on CUDA, ``dense``, rows shorter than two windows, forward-only inference, where
    SDPA's fused kernel serves each band) runs the two paths' own kernels."""
    q, k, v, window = call.q, call.k, call.v, call.window
    n = q.shape[2]
    if call.backend != "banded" or n < 2 * window or fused_forward_applies(q, k, v):
        return sa.attend(call), swa.attend(call)
    half = masks.sa_half_width(window)
    band = Band(half, half, call.perm.view(-1, n), call.inv, call.lengths)
    y_sa, y_swa = multi_band_attention(q, k, v, [band, Band(window - 1, 0)], scale=call.scale)
    return y_sa, y_swa


VARIANT = SA_SWA = Variant(
    name="sa_swa", label="SA+SWA", color="#2ECC71", marker="D", paths=("sa", "swa"),
    kernel=kernel, backends=("banded", "flex", "dense"),
    mask=union_mask,  # the keys either path reads: the union
    keys_attended_row=union_keys,
    keys_computed_at=lambda spec, n: 2 * min(spec.window, n),  # two bands
    uses_permutation=True, draw=draw_permutation, check_draw=check_permutation,
    windowed=True, gated=True, training_free_twin="sa_swa_union", local_paths=("swa",),
    description="gated SA+SWA: an SA path and an SWA path mixed by learned output gates", title="SA + SWA",
)
