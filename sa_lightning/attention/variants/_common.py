"""What several variant files share: the permutation's slot table, the random keys' checked seeds, the dense path
of any mask, and the SA ∪ SWA mask with its key count (the training-free union and the gated pair read the same
keys)."""
from __future__ import annotations

import torch

from .. import masks
from ..dense import dense_masked_attention
from .._checks import check_padded_perm, check_perm
from ..permutation import invert_permutation, prefix_permutations, sample_permutation
from ..random_keys import check_keys, dense_is_cheaper, expected_width
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


def check_permutation(perm, batch: int, n: int, device, lengths=None) -> torch.Tensor:
    """A caller's σ, checked (values included): a permutation that keeps every row's padding last."""
    perm = check_perm(perm, batch, n, device)
    check_padded_perm(perm, lengths)
    return perm


def call_seeds(call) -> torch.Tensor:
    """The random-keys call's seeds, checked (values too unless the caller vouches for them)."""
    return check_keys(call.perm, call.q.shape[0], call.q.shape[2], call.q.device, call.lengths, values=call.validate)


def dense_for_keys(call) -> bool:
    """The random-keys route: the n x n path where asked for, or where it is cheaper than gathering about the
    widest table row's keys and the query's own (``dense_is_cheaper``)."""
    return call.backend == "dense" or dense_is_cheaper(call.q, expected_width(call.spec.window) + 1, call.k.shape[1])


def dense_with_lse(call, mask_mod: masks.MaskMod):
    """(output, log-sum-exp) of ``mask_mod`` through the n x n dense path (rows under two windows, checks)."""
    B, _, n, _ = call.q.shape
    mask = masks.dense(mask_mod, n, batch=B, device=call.q.device)
    return dense_masked_attention(call.q, call.k, call.v, mask, scale=call.scale, return_lse=True)


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
