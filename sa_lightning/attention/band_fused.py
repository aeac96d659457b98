"""The forward-only band path on CPU: SDPA's fused kernel over each query block's key window, read in place.

``banded_attention`` takes it when no gradient is needed (``band_common.fused_forward_applies``). It
materializes neither the windows nor the scores; why that is worth a path of its own is measured in
docs/benchmarks.md ("SA forward against compiled FlexAttention, CPU").
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .band_common import mask_bias, sdpa_lse, softmax_dtype, take_rows


def fused_window_forward(q, k, v, q_src, k_src, inv, blocked, scale, blk, W, return_lse):
    """Forward only: SDPA's fused CPU kernel over each query block's key window, read in place.

    Keys and values are laid out once in slot order (one copy each, no duplication). Block i's
    window, slots i*blk .. i*blk + W - 1, is an overlapping strided view of that copy, so for each
    batch row one kernel call sees the query blocks as its batch and the heads as its heads (GQA is
    native), and neither the (nb, W, d) windows nor the scores are materialized. ``inv`` (None for
    SWA) maps tokens to slots. Returns (B, Hq, n, d), laid out as (B, n, Hq, d) like SDPA's own
    output, and with ``return_lse`` also the log-sum-exp (B, Hq, n).
    """
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    nb = blocked.shape[1]
    # (B, Hkv, L, d) in slot order with the band's margins; the strided windows below need it dense
    ks, vs = take_rows(k, k_src).contiguous(), take_rows(v, k_src).contiguous()
    L = ks.shape[2]
    qs = take_rows(q, q_src).contiguous()  # (B, Hq, nb*blk, d)
    bias = mask_bias(blocked, q.dtype).unsqueeze(2)  # (Bp, nb, 1, blk, W)
    out = q.new_empty(B, n, Hq, d)
    lse = q.new_empty(B, n, Hq, dtype=softmax_dtype(q.dtype)) if return_lse else None  # SDPA's lse dtype
    for b in range(B):
        qb = qs[b].view(Hq, nb, blk, d).transpose(0, 1)  # (nb, Hq, blk, d), a view
        kb = ks[b].as_strided((nb, Hkv, W, d), (blk * d, L * d, d, 1), ks[b].storage_offset())
        vb = vs[b].as_strided((nb, Hkv, W, d), (blk * d, L * d, d, 1), vs[b].storage_offset())
        mask = bias[b if bias.shape[0] > 1 else 0]
        if return_lse:
            ob, lb = sdpa_lse(qb, kb, vb, causal=False, scale=scale, attn_mask=mask)
        else:
            ob = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=Hq != Hkv)
        rows = ob.transpose(1, 2).reshape(nb * blk, Hq, d)  # slot order; a view of the kernel's layout
        inv_b = None if inv is None else inv[b if inv.shape[0] > 1 else 0]
        if inv_b is None:
            out[b] = rows[:n]
        else:
            torch.index_select(rows, 0, inv_b, out=out[b])
        if return_lse:
            lrows = lb.transpose(1, 2).reshape(nb * blk, Hq)
            lse[b] = lrows[:n] if inv_b is None else lrows[inv_b]
    out = out.transpose(1, 2)
    return (out, lse.transpose(1, 2)) if return_lse else out
