"""Bucketed SA: σ's slots cut into buckets of b = 2⌈w/2⌉ − 1 consecutive slots (SA's band holds as
many), and ordinary causal attention inside each bucket, its tokens in their original order. Query i reads key j
when j <= i and slot(i) // b == slot(j) // b. A pair shares a bucket with SA's connection probability
(b − 1)/(n − 1), but the neighbourhoods are disjoint rather than overlapping bands, each query reads about half as
many keys as SA, and a bucket needs no mask function: the stock causal kernel runs it (``attention.bucketed``)."""
from __future__ import annotations

from .. import masks, oracle
from ..bucketed import bucket_size, bucket_slots, bucketed_attention, bucketed_attention_lse, bucketed_in_slots
from ..registry import Variant
from ._common import check_permutation, dense_with_lse, draw_permutation, slot_of


def mask(spec, n, perm, lengths=None):
    return masks.bucketed(slot_of(perm), spec.window, lengths)


def kernel_with_lse(call):
    if call.backend == "dense":
        return dense_with_lse(call, mask(call.spec, call.q.shape[2], call.perm, call.lengths))
    return bucketed_attention_lse(call.q, call.k, call.v, call.window, call.perm, scale=call.scale)


def kernel(call):
    """The buckets through the stock causal kernel (``dense``: the n x n mask)."""
    if call.backend == "dense":
        return (kernel_with_lse(call)[0],)
    return (bucketed_attention(call.q, call.k, call.v, call.window, call.perm, scale=call.scale),)


def keys_attended_row(spec, length, row=None):
    """A bucket of c tokens holds c (c + 1) / 2 causal pairs; a row's valid tokens fill its first slots, so its
    buckets are full but the last: the same count whatever σ."""
    b = bucket_size(spec.window)
    full, rest = divmod(length, b)
    return full * b * (b + 1) // 2 + rest * (rest + 1) // 2


VARIANT = SA_BUCKET = Variant(
    name="sa_bucket", label="SA-bucket", color="#34495E", marker="<", paths=("sa_bucket",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.sa_bucket_mask(perm, spec.window, q.shape[0], lengths),
    keys_attended_row=keys_attended_row,
    # the causal half of each bucket's b x b block (a causal kernel skips the rest)
    keys_computed_at=lambda spec, n: (min(bucket_size(spec.window), n) + 1) / 2,
    uses_permutation=True, circular=False, draw=draw_permutation, check_draw=check_permutation, windowed=True,
    slot_order=lambda spec, perm: bucket_slots(perm, spec.window),
    slot_kernel=lambda call: bucketed_in_slots(call.q, call.k, call.v, call.window, scale=call.scale),
    slot_backends=("banded",), slot_padding=True,
    fused_below=None,  # its buckets run on the stock causal kernel already (8.0 ms at n = 128, the fused 7.7)
    description="SA's permutation cut into buckets of its band's size, causal attention inside each",
    title="Bucketed SA",
)
