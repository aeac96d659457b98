"""What several variant files share: the permutation's slot table and its draw, the dense path of any mask, SWA's
band with its log-sum-exp, the one factory of every training-free union with SWA (``union_with_swa``), and the
SA ∪ SWA mask with its key count (the training-free union and the gated pair read the same keys). Kernels here
compute only, on a call ``Variant.__call__`` has checked."""
from __future__ import annotations

from typing import Callable

import torch

from .. import masks
from ..banded import banded_attention
from ..dense import dense_masked_attention, merge_partials
from .._checks import check_padded_perm, check_perm
from ..permutation import invert_permutation, prefix_permutations, sample_permutation
from ..random_keys import dense_is_cheaper, expected_width
from ..sinks import causal_keys


def slot_of(perm: torch.Tensor) -> torch.Tensor:
    """Each token's slot, (1 or B, n), from a gather index (n,) or (B, n)."""
    return invert_permutation(perm if perm.dim() == 2 else perm.unsqueeze(0))


def draw_permutation(spec, n: int, lengths, generator, device=None) -> torch.Tensor:
    """σ (``Variant.draw`` of the variants that permute): one (n,) for the batch from one generator, (B, n) with
    ``lengths`` (each row's padding kept in place), or (B, n) from a list of per-row generators."""
    if isinstance(generator, (list, tuple)):
        return prefix_permutations([int(x) for x in lengths], n, list(generator), device)
    return sample_permutation(n, generator=generator, device=device, lengths=lengths)


def check_permutation(perm, batch: int, n: int, device, lengths=None, values: bool = True) -> torch.Tensor:
    """A caller's σ, checked: a permutation that keeps every row's padding last (its values read only with
    ``values``; without, its type, shape and device)."""
    perm = check_perm(perm, batch, n, device, values=values)
    if values:
        check_padded_perm(perm, lengths)
    return perm


def dense_for_keys(call) -> bool:
    """The random-keys route: the n x n path where asked for, or where it is cheaper than gathering about the
    widest table row's keys and the query's own (``dense_is_cheaper``)."""
    return call.backend == "dense" or dense_is_cheaper(call.q, expected_width(call.spec.window) + 1, call.k.shape[1])


def dense_with_lse(call, mask_mod: masks.MaskMod):
    """(output, log-sum-exp) of ``mask_mod`` through the n x n dense path (rows under two windows, checks)."""
    B, _, n, _ = call.q.shape
    mask = masks.dense(mask_mod, n, batch=B, device=call.q.device)
    return dense_masked_attention(call.q, call.k, call.v, mask, scale=call.scale, return_lse=True)


def dense_output(call, mask_mod: masks.MaskMod) -> torch.Tensor:
    """The output of ``mask_mod`` through the n x n dense path, with no log-sum-exp to keep."""
    B, _, n, _ = call.q.shape
    mask = masks.dense(mask_mod, n, batch=B, device=call.q.device)
    return dense_masked_attention(call.q, call.k, call.v, mask, scale=call.scale)


def swa_with_lse(call):
    """(output, log-sum-exp) of SWA's window: the O(n*w) band, or the dense path for a row under two windows."""
    w = call.window
    if call.q.shape[2] < 2 * w:
        return dense_with_lse(call, masks.sliding_window(w))
    return banded_attention(call.q, call.k, call.v, before=w - 1, after=0, scale=call.scale, return_lse=True)


def dense_under_two_windows(call) -> bool:
    """The union's n x n route: asked for, or a row under two windows (where the bands would overlap anyway)."""
    return call.backend == "dense" or call.q.shape[2] < 2 * call.window


def union_with_swa(mask, far: Callable, dense: Callable = dense_under_two_windows) -> Callable:
    """The kernel with log-sum-exp of a training-free union: one softmax over SWA's window and ``far``'s keys
    beyond it. ``far(call)`` -> (output, log-sum-exp) over the far path's keys at distance >= w only (its
    ``skip_recent``), so the two key sets are disjoint and merge by log-sum-exp (no key counts twice, nothing
    n x n). Where ``dense(call)``, the union's mask (``mask(spec, n, draw, lengths)``) runs through the dense path."""

    def kernel_with_lse(call):
        if dense(call):
            return dense_with_lse(call, mask(call.spec, call.q.shape[2], call.perm, call.lengths))
        y_swa, lse_swa = swa_with_lse(call)
        y_far, lse_far = far(call)
        return merge_partials(y_swa, lse_swa, y_far, lse_far)  # half inputs merge in fp32, float64 in float64

    return kernel_with_lse


def union_mask(spec, n, perm, lengths=None):
    return masks.union(masks.stochastic(slot_of(perm), spec.window, lengths), masks.sliding_window(spec.window))


def union_keys(spec, length: int, row: torch.Tensor) -> int:
    """Keys of SA ∪ SWA over one row (valid tokens in slots 0..length-1, ``row`` its gather index): SWA's
    window, plus the SA band's causal keys that lie outside it. O(length * w), on ``row``'s device."""
    window = spec.window
    half = masks.sa_half_width(window)
    if 2 * half + 1 >= length:  # the band holds every slot: causal full attention
        return causal_keys(length)
    p = row[:length]
    offsets = torch.arange(-half, half + 1, device=p.device)
    keys = p[(torch.arange(length, device=p.device).view(-1, 1) + offsets) % length]  # (L, 2h+1) tokens
    query = p.view(-1, 1)
    beyond = (keys <= query) & (query - keys >= window)
    return causal_keys(length, window) + int(beyond.sum())
