"""Training-free SA+SWA: one softmax over the union of the SA and SWA masks (no gate to learn). SWA's band and
SA's band minus the SWA window are computed apart and merged by log-sum-exp, so no key counts twice."""
from __future__ import annotations

from .. import oracle
from ..functional import _sa_swa_union, permutation_args, sa_swa_union_attention
from ..registry import Variant, register_variant
from ._common import check_permutation, dense_with_lse, draw_permutation, union_keys, union_mask


def kernel(call):
    if call.backend == "dense":
        B, _, n, _ = call.q.shape
        perm, _, lengths = permutation_args(call.perm, None, None, call.lengths, B, n, call.q.device,
                                             call.validate)
        return (dense_with_lse(call, union_mask(call.spec, n, perm, lengths))[0],)
    return (sa_swa_union_attention(call.q, call.k, call.v, call.window, call.perm, scale=call.scale,
                                   lengths=call.lengths, inv=call.inv, validate=call.validate),)


def kernel_with_lse(call):
    return _sa_swa_union(call.q, call.k, call.v, call.window, call.perm, call.inv, call.lengths, call.scale,
                         return_lse=True)


SA_SWA_UNION = register_variant(Variant(
    name="sa_swa_union", label="SA+SWA", color="#2ECC71", marker="D", paths=("sa_swa_union",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=union_mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.sa_swa_union_mask(perm, spec.window, q.shape[0], lengths),
    keys_attended_row=union_keys,
    keys_computed_at=lambda spec, n: 2 * min(spec.window, n),  # two bands
    uses_permutation=True, draw=draw_permutation, check_draw=check_permutation, windowed=True,
    description="training-free SA+SWA: one softmax over both masks",
))
