"""Training-free SA+SWA: one softmax over the union of the SA and SWA masks (no gate to learn). SWA's band and
SA's band minus the SWA window are computed apart and merged by log-sum-exp, so no key counts twice."""
from __future__ import annotations

from .. import masks, oracle
from ..banded import banded_attention
from ..registry import Variant
from ._common import check_permutation, dense_output, draw_permutation, union_keys, union_mask, union_with_swa


def far_with_lse(call):
    """SA's band over σ's slots, less the keys SWA's window holds, with its log-sum-exp."""
    half = masks.sa_half_width(call.window)
    return banded_attention(call.q, call.k, call.v, before=half, after=half, perm=call.pos, lengths=call.lengths,
                            scale=call.scale, skip_recent=call.window, return_lse=True, inv=call.inv)


kernel_with_lse = union_with_swa(union_mask, far_with_lse)


def kernel(call):
    if call.backend != "dense" and call.q.shape[2] < 2 * call.window:  # one softmax: no log-sum-exp to keep
        return (dense_output(call, union_mask(call.spec, call.q.shape[2], call.perm, call.lengths)),)
    return (kernel_with_lse(call)[0],)


VARIANT = SA_SWA_UNION = Variant(
    name="sa_swa_union", label="SA+SWA", color="#2ECC71", marker="D", paths=("sa_swa_union",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=union_mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.sa_swa_union_mask(perm, spec.window, q.shape[0], lengths),
    keys_attended_row=union_keys,
    keys_computed_at=lambda spec, n: 2 * min(spec.window, n),  # two bands
    uses_permutation=True, draw=draw_permutation, check_draw=check_permutation, windowed=True,
    description="training-free SA+SWA: one softmax over both masks",
)
