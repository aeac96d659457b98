"""Attention sinks (StreamingLLM, beyond the paper) and the keys-per-query budget of a mask.

**Sinks.** With ``sink = k``, query i also reads the first k tokens of its row: key j is visible when the
variant's own mask allows it, or when j < k and j <= i. The variant runs its own O(n*w) kernel and returns
its log-sum-exp; the sink keys it did not already read are scored apart, (n x k), and merged into the same
softmax by log-sum-exp, so no key counts twice and nothing n x n is built.

**Budget.** :func:`keys_per_query` counts, from the same masks the kernels use, how many keys the queries
of an input attend: the x-axis of the equal-budget comparison (SA∪SWA at w reads more keys than SWA at w).

Rows follow the kernels' padding convention: row b's valid tokens come first, ``lengths[b]`` of them.
"""
from __future__ import annotations

import torch

from . import masks
from ._checks import check_lengths, check_nonnegative, check_positive, check_qkv, default_scale
from ._finite import guard_nonfinite
from .banded import banded_attention
from .dense import dense_masked_attention, merge_partials
from .permutation import invert_permutation

#: the variants that take sinks (training-free: the gated two-path sa_swa is not among them)
SINK_VARIANTS = ("swa", "sa", "sa_swa_union")


def variant_mask(variant: str, window: int, pos: torch.Tensor | None, lengths: torch.Tensor | None, B: int,
                 n: int) -> masks.MaskMod:
    """The mask function in original positions that ``variant``'s kernel computes (``pos`` a (1|B, n) perm)."""
    if variant == "full":
        return masks.causal
    if variant == "swa":
        return masks.sliding_window(window)
    slot = invert_permutation(pos).expand(B, n)
    sa = masks.stochastic(slot, window, lengths)
    if variant == "sa":
        return sa
    if variant == "sa_swa_union":
        return masks.union(sa, masks.sliding_window(window))
    raise ValueError(f"no single mask for variant {variant!r}.")


def with_sink(mask: masks.MaskMod, sink: int) -> masks.MaskMod:
    """``mask`` plus the first ``sink`` keys of the row, causally."""
    if sink <= 0:
        return mask

    def out(b, h, q_idx, kv_idx):
        return mask(b, h, q_idx, kv_idx) | ((kv_idx < sink) & (kv_idx <= q_idx))

    return out


def _main_with_lse(q, k, v, variant, window, pos, lengths, inv, scale):
    """The variant's own output and log-sum-exp: the banded kernel, or the dense path for rows under 2w."""
    B, _, n, _ = q.shape
    if n < 2 * window:
        mask = masks.dense(variant_mask(variant, window, pos, lengths, B, n), n, batch=B, device=q.device)
        return dense_masked_attention(q, k, v, mask, scale=scale, return_lse=True)
    half = masks.sa_half_width(window)
    if variant == "swa":
        return banded_attention(q, k, v, before=window - 1, after=0, scale=scale, return_lse=True)
    if variant == "sa":
        return banded_attention(q, k, v, before=half, after=half, perm=pos, lengths=lengths, scale=scale,
                                return_lse=True, inv=inv)
    from .functional import _sa_swa_union

    return _sa_swa_union(q, k, v, window, pos, inv, lengths, scale, return_lse=True)


def sink_attention(q, k, v, variant: str, window: int, sink: int, perm=None, *, lengths=None, inv=None,
                   scale: float | None = None) -> torch.Tensor:
    """``variant`` (swa | sa | sa_swa_union) at ``window`` with the first ``sink`` keys of each row added.
    ``perm``, ``lengths`` and ``inv`` as for ``stochastic_attention`` (SA's variants draw ``perm`` when None)."""
    if variant not in SINK_VARIANTS:
        raise ValueError(f"sinks apply to {', '.join(SINK_VARIANTS)}, not {variant!r}.")
    sink = check_nonnegative("sink", sink)
    B, Hq, _, n, d = check_qkv(q, k, v)
    window = check_positive("window", window)
    scale = default_scale(d, scale)
    if variant == "swa":
        pos, lengths = None, check_lengths(lengths, B, n, q.device)
    else:
        from .functional import _permutation_args

        perm, inv, lengths = _permutation_args(perm, inv, None, lengths, B, n, q.device)
        pos = perm if perm.dim() == 2 else perm.unsqueeze(0)
    return guard_nonfinite(lambda q, k, v: _with_sinks(q, k, v, variant, window, sink, pos, lengths, inv, scale),
                           q, k, v)


def _with_sinks(q, k, v, variant, window, sink, pos, lengths, inv, scale):
    B, _, n, _ = q.shape
    y, lse = _main_with_lse(q, k, v, variant, window, pos, lengths, inv, scale)
    s = min(sink, n)
    if s == 0:
        return y
    # the sink keys each query does not already read: (B, 1, n, s)
    b = torch.arange(B, device=q.device).view(-1, 1, 1, 1)
    qi = torch.arange(n, device=q.device).view(1, 1, n, 1)
    kj = torch.arange(s, device=q.device).view(1, 1, 1, s)
    extra = (kj <= qi) & ~variant_mask(variant, window, pos, lengths, B, n)(b, 0, qi, kj)
    y_s, lse_s = dense_masked_attention(q, k[:, :, :s], v[:, :, :s], extra, scale=scale, return_lse=True)
    return merge_partials(y, lse, y_s, lse_s)[0]


# ---- the budget: keys each query attends ---------------------------------------------------------
def _causal_keys(length: int, window: int | None = None) -> int:
    """Sum over queries i < length of min(i + 1, window): causal full attention, or SWA at ``window``."""
    if window is None or length <= window:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def _union_keys(pos: torch.Tensor, length: int, window: int) -> int:
    """Keys of SA ∪ SWA over one row (valid tokens in slots 0..length-1, ``pos`` its gather index): SWA's
    window, plus the SA band's causal keys that lie outside it. O(length * w), on ``pos``'s device."""
    half = masks.sa_half_width(window)
    if 2 * half + 1 >= length:  # the band holds every slot: causal full attention
        return _causal_keys(length)
    p = pos[:length]
    offsets = torch.arange(-half, half + 1, device=p.device)
    keys = p[(torch.arange(length, device=p.device).view(-1, 1) + offsets) % length]  # (L, 2h+1) tokens
    query = p.view(-1, 1)
    beyond = (keys <= query) & (query - keys >= window)
    return _causal_keys(length, window) + int(beyond.sum())


def keys_per_query(variant: str, n: int, *, window: int = 1, perm: torch.Tensor | None = None,
                   lengths: torch.Tensor | None = None, block_size: int = 64, top_k: int = 2,
                   sink: int = 0, batch: int = 1) -> tuple[int, int]:
    """(keys attended, queries) summed over the valid queries of a (batch, n) input, counted from the
    variant's mask: causal ``full``, ``swa``, ``sa`` and ``sa_swa_union`` (from ``perm``), and ``moba``
    (own block plus top_k - 1 past blocks, whichever the gate picks: the count does not depend on it).
    ``sink`` adds the first ``sink`` keys that the mask does not already hold.

    Closed forms where the mask allows one: SA's band holds each unordered pair of slots within w/2 once,
    and exactly one of the two tokens is the earlier, so a row of L tokens reads L * (h + 1) keys whatever
    the permutation (h = ceil(w/2) - 1). Only the union and the sinks depend on ``perm``."""
    rows = [n] * batch if lengths is None else [int(x) for x in lengths.tolist()]
    pos = None if perm is None else (perm if perm.dim() == 2 else perm.unsqueeze(0))
    half = masks.sa_half_width(window)
    keys = 0
    for b, length in enumerate(rows):
        if variant == "full":
            keys += _causal_keys(length)
        elif variant == "swa":
            keys += _causal_keys(length, window)
        elif variant == "sa":
            keys += _causal_keys(length) if 2 * half + 1 >= length else length * (half + 1)
        elif variant == "sa_swa_union":
            keys += _union_keys(pos[b if pos.shape[0] > 1 else 0], length, window)
        elif variant == "moba":
            tok = torch.arange(length)
            keys += int((tok % block_size + 1 + block_size * torch.clamp(tok // block_size, max=top_k - 1)).sum())
        else:
            raise ValueError(f"no key count for variant {variant!r}.")
        if sink > 0 and variant in SINK_VARIANTS:
            keys += _extra_sink_keys(variant, window, sink, pos, b, length)
    return keys, sum(rows)


def _extra_sink_keys(variant, window, sink, pos, b, length) -> int:
    """Sink keys (j < sink, j <= i) that the variant's own mask does not already hold, over one row."""
    s = min(sink, length)
    row = None if pos is None else pos[b if pos.shape[0] > 1 else 0].view(1, -1)
    device = None if row is None else row.device
    lengths = None if row is None else torch.tensor([length], device=device)
    mask = variant_mask(variant, window, row, lengths, 1, row.shape[-1] if row is not None else length)
    qi = torch.arange(length, device=device).view(1, 1, -1, 1)
    kj = torch.arange(s, device=device).view(1, 1, 1, -1)
    zero = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    return int(((kj <= qi) & ~mask(zero, 0, qi, kj)).sum())
