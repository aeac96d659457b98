"""Training-free bucketed SA + SWA: one softmax over the bucket and SWA's window. The window and the bucket's keys
beyond it are computed apart and merged by log-sum-exp, so no key counts twice."""
from __future__ import annotations

from .. import masks, oracle
from ..bucketed import bucket_order, bucket_size, bucketed_attention_lse
from ..registry import Variant
from ..sinks import causal_keys
from ._common import check_permutation, draw_permutation, slot_of, union_with_swa


def mask(spec, n, perm, lengths=None):
    return masks.union(masks.bucketed(slot_of(perm), spec.window, lengths), masks.sliding_window(spec.window))


def far_with_lse(call):
    """Each bucket's keys at distance >= w, with their log-sum-exp."""
    return bucketed_attention_lse(call.q, call.k, call.v, call.window, call.perm, scale=call.scale,
                                  skip_recent=call.window)


# a row under two windows still merges: SWA's own dense window with the buckets' far keys
kernel_with_lse = union_with_swa(mask, far_with_lse, dense=lambda call: call.backend == "dense")


def keys_attended_row(spec, length, row):
    """SWA's window, plus each bucket's earlier keys at distance >= w. O(length * b), on ``row``'s device."""
    window, b = spec.window, bucket_size(spec.window)
    pos = bucket_order(row[:length].view(1, -1), b).view(-1, b)  # the spare `length` sorts last: never earlier
    gap = pos.unsqueeze(-1) - pos.unsqueeze(-2)  # query - key, within each bucket
    far = (gap >= window) & (pos.unsqueeze(-1) < length)
    return causal_keys(length, window) + int(far.sum())


VARIANT = SA_BUCKET_SWA_UNION = Variant(
    name="sa_bucket_swa_union", label="SA-bucket+SWA", color="#D4AC0D", marker=">", paths=("sa_bucket_swa_union",),
    kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: (oracle.sa_bucket_mask(perm, spec.window, q.shape[0], lengths)
                                                   | oracle.swa_mask(q.shape[2], spec.window, q.device)),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(spec.window, n) + min(bucket_size(spec.window), n),  # the whole b x b block
    uses_permutation=True, circular=False, draw=draw_permutation, check_draw=check_permutation, windowed=True,
    description="training-free bucketed SA and SWA's window in one softmax",
)
