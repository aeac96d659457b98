"""Stochastic Attention: sliding-window attention in a random order of the tokens, causal in the original
order. Query i reads key j when j <= i and |slot(i) - slot(j)|_n < w / 2 (slot: the token's place in σ)."""
from __future__ import annotations

from .. import masks, oracle
from ..banded import banded_attention
from ..dense import dense_masked_attention
from ..permutation import invert_permutation, permute_tokens
from ..registry import Variant
from ..sinks import causal_keys
from ._common import check_permutation, dense_with_lse, draw_permutation, slot_of


def mask(spec, n, perm, lengths=None):
    return masks.stochastic(slot_of(perm), spec.window, lengths)


def attend(call):
    """SA's output: the O(n*w) band over σ's slots, FlexAttention in slot order, or the n x n mask (``dense``,
    and rows under two windows)."""
    q, k, v, window, scale, lengths, backend = call.q, call.k, call.v, call.window, call.scale, call.lengths, \
        call.backend
    B, _, n, _ = q.shape
    if backend == "flex" and lengths is not None:
        backend = "banded"  # the flex block mask is built per (n, band); ragged bands would rebuild it per call
    pos = call.pos
    if backend == "dense" or (backend == "banded" and n < 2 * window):
        slot = invert_permutation(pos).expand(B, n)
        mask = masks.stochastic(slot, window, lengths)
        return dense_masked_attention(q, k, v, masks.dense(mask, n, batch=B, device=q.device), scale=scale)
    if backend == "flex":
        from ..flex import sa_flex_slots

        inv = invert_permutation(pos) if call.inv is None else call.inv.view(-1, n)
        # row copies both ways: a gather's backward would be an atomic index_add (4.9 ms of SA's 15.1 on an H200)
        qs, ks, vs = (permute_tokens(t, pos, inv) for t in (q, k, v))
        ys = sa_flex_slots(qs, ks, vs, pos, window, scale=scale)
        return permute_tokens(ys, inv, pos)
    half = masks.sa_half_width(window)
    return banded_attention(q, k, v, before=half, after=half, perm=pos, lengths=lengths, scale=scale, inv=call.inv)


def kernel(call):
    return (attend(call),)


def kernel_with_lse(call):
    if call.q.shape[2] < 2 * call.window:
        return dense_with_lse(call, mask(call.spec, call.q.shape[2], call.perm, call.lengths))
    half = masks.sa_half_width(call.window)
    return banded_attention(call.q, call.k, call.v, before=half, after=half, perm=call.pos, lengths=call.lengths,
                            scale=call.scale, return_lse=True, inv=call.inv)


def slot_order(spec, perm):
    """The layer order (``attention.slots``): σ's slots."""
    from ..slots import SlotOrder

    pos = perm if perm.dim() == 2 else perm.unsqueeze(0)
    return SlotOrder(pos=pos, index=pos, inverse=invert_permutation(pos))


def slot_kernel(call):
    """SA on q, k, v already in slot order (FlexAttention: the circular band over the slots, causal on the
    original positions ``call.perm``). Only there: the banded kernel reorders within its own window gathers,
    and the dense path reorders nothing."""
    from ..flex import sa_flex_slots

    return sa_flex_slots(call.q, call.k, call.v, call.perm, call.window, scale=call.scale)


def keys_attended_row(spec, length, row):
    """SA's band holds each unordered pair of slots within w/2 once, and exactly one of the two tokens is the
    earlier, so a row of L tokens reads L * (h + 1) keys whatever σ (h = ceil(w/2) - 1)."""
    half = masks.sa_half_width(spec.window)
    return causal_keys(length) if 2 * half + 1 >= length else length * (half + 1)


VARIANT = SA = Variant(
    name="sa", label="SA", color="#E74C3C", marker="^", paths=("sa",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "flex", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.sa_mask(perm, spec.window, q.shape[0], lengths),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(spec.window, n),  # the band is computed; the causal test keeps about half
    slot_mask=lambda spec, slots: masks.stochastic(slots, spec.window),
    uses_permutation=True, draw=draw_permutation, check_draw=check_permutation, windowed=True,
    slot_order=slot_order, slot_kernel=slot_kernel, slot_backends=("flex",),
    description="sliding-window attention in a random permutation of the tokens",
    title="Stochastic Attention",
)
