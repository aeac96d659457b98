"""Training-free bucketed SA + SWA: one softmax over the bucket and SWA's window. The window and the bucket's keys
beyond it are computed apart and merged by log-sum-exp, so no key counts twice."""
from __future__ import annotations

from dataclasses import replace

from .. import masks, oracle
from .._finite import guard_nonfinite
from ..bucketed import bucket_order, bucket_size, bucketed_attention_lse
from ..dense import merge_partials
from ..registry import Variant, register_variant
from ..sinks import causal_keys
from ._common import check_permutation, dense_with_lse, draw_permutation, slot_of
from .sa_bucket import checked
from .swa import SWA


def mask(spec, n, perm, lengths=None):
    return masks.union(masks.bucketed(slot_of(perm), spec.window, lengths), masks.sliding_window(spec.window))


def _with_lse(call):
    if call.backend == "dense":
        return dense_with_lse(call, mask(call.spec, call.q.shape[2], call.perm, call.lengths))
    y_swa, lse_swa = SWA.kernel_with_lse(call)
    y_far, lse_far = bucketed_attention_lse(call.q, call.k, call.v, call.window, call.perm, scale=call.scale,
                                            skip_recent=call.window)
    return merge_partials(y_swa, lse_swa, y_far, lse_far)


def kernel_with_lse(call):
    """In the debug mode (``check_finite``) a non-finite key or value reaches only the rows that read it."""
    call = checked(call)
    return guard_nonfinite(lambda q, k, v: _with_lse(replace(call, q=q, k=k, v=v)), call.q, call.k, call.v)


def kernel(call):
    return (kernel_with_lse(call)[0],)


def keys_attended_row(spec, length, row):
    """SWA's window, plus each bucket's earlier keys at distance >= w. O(length * b), on ``row``'s device."""
    window, b = spec.window, bucket_size(spec.window)
    pos = bucket_order(row[:length].view(1, -1), b).view(-1, b)  # the spare `length` sorts last: never earlier
    gap = pos.unsqueeze(-1) - pos.unsqueeze(-2)  # query - key, within each bucket
    far = (gap >= window) & (pos.unsqueeze(-1) < length)
    return causal_keys(length, window) + int(far.sum())


SA_BUCKET_SWA_UNION = register_variant(Variant(
    name="sa_bucket_swa_union", label="SA-bucket+SWA", color="#D4AC0D", marker=">", paths=("sa_bucket_swa_union",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: (oracle.sa_bucket_mask(perm, spec.window, q.shape[0], lengths)
                                                   | oracle.swa_mask(q.shape[2], spec.window, q.device)),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(spec.window, n) + min(bucket_size(spec.window), n),  # the whole b x b block
    uses_permutation=True, circular=False, draw=draw_permutation, check_draw=check_permutation, windowed=True,
    description="training-free bucketed SA and SWA's window in one softmax",
))
