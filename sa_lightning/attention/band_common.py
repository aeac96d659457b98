"""What the banded kernel paths share: a band's layout and mask, the scores' bias, GQA folding, gathers.

MoBA (``moba.py``) reuses the GQA folding, the softmax dtype, SDPA's log-sum-exp kernel and the test for
the forward-only path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_HALF = (torch.float16, torch.bfloat16)


def softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _HALF else dtype


def fold_groups(q: torch.Tensor, hkv: int, nb: int, blk: int) -> torch.Tensor:
    """(B, Hq, nb*blk, d) -> (B, Hkv, nb, G*blk, d): a kv head's query heads share one matmul."""
    B, Hq, _, d = q.shape
    G = Hq // hkv
    q = q.view(B, hkv, G, nb, blk, d)
    return q.transpose(2, 3).reshape(B, hkv, nb, G * blk, d)


def unfold_groups(y: torch.Tensor, hq: int, n: int) -> torch.Tensor:
    """Inverse of ``fold_groups``, cropped to n."""
    B, hkv, nb, gblk, d = y.shape
    G = hq // hkv
    blk = gblk // G
    y = y.view(B, hkv, nb, G, blk, d).transpose(2, 3).reshape(B, hq, nb * blk, d)
    return y[:, :, :n]


def default_block(span: int) -> int:
    """Query block size: small enough that the wasted key columns (block - 1) stay near a quarter of
    the band, large enough that each matmul keeps the cores busy."""
    return max(16, min(64, 1 << max(span // 4, 1).bit_length()))


def _blocked(n: int, blk: int, nb: int, before: int, after: int, q_pos: torch.Tensor | None,
             k_pos: torch.Tensor | None, lengths: torch.Tensor | None, device, skip_recent: int = 0, *,
             lead: int, width: int) -> torch.Tensor:
    """(Bp, nb, blk, W) bool: True where query ``r`` of block ``i`` must not read window column ``u``.

    Column ``u`` of block ``i`` is key slot ``i*blk - lead + u``, for a window of ``width`` columns; the
    band's own reach is lead = before, W = blk + before + after, and a wider window masks its extra
    columns. Without positions (SWA) the band is clipped at the sequence ends; with them
    (SA) the band is circular and a key is read only if its original position ``k_pos`` (the tokens of
    slots -lead .. (nb-1)*blk - lead + W - 1) is not after the query's ``q_pos``. ``lengths`` (B, 1)
    marks the circular band of a row shorter than the band: offsets that wrap onto a slot already in
    the band are dropped, so no key is read twice. ``skip_recent`` also drops keys with
    0 <= q_pos - k_pos < skip_recent: the SWA window that the union of SA and SWA reads in its other part.
    """
    W = width
    r = torch.arange(blk, device=device).view(blk, 1)
    u = torch.arange(W, device=device).view(1, W)
    offset = u - r - (lead - before)  # the key's place in the query's band: 0 .. before + after
    blocked = ((offset < 0) | (offset > before + after)).expand(nb, blk, W)
    if q_pos is None:
        t = torch.arange(nb, device=device).view(nb, 1) * blk - lead + u
        return (blocked | ((t < 0) | (t >= n)).view(nb, 1, W)).unsqueeze(0)
    pad = nb * blk - n
    # Padded query slots get position -1 so they read nothing real; they are cropped anyway.
    pos_q = F.pad(q_pos, (0, pad), value=-1).view(-1, nb, blk, 1)
    pos_k = k_pos.unfold(1, W, blk).unsqueeze(2)  # (Bp, nb, 1, W)
    blocked = blocked.unsqueeze(0) | (pos_k > pos_q)
    if skip_recent:
        blocked = blocked | (pos_q - pos_k < skip_recent)
    if lengths is not None:
        blocked = blocked | (offset.view(1, 1, blk, W) >= lengths.view(-1, 1, 1, 1))
    return blocked


def mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Scores' additive mask: 0 where ``mask`` is False, a large finite negative where it is True.

    Adding a bias is branch-free. ``masked_fill_`` with SA's scattered causal mask mispredicts a branch
    per element, and setting the masked scores instead, even branch-free on their bits ((s & keep) | fill,
    two passes), costs more than adding; the figures are in docs/benchmarks.md ("Kernel path choices").
    The bias is finite, so fully masked padding rows stay free of NaN; exp() of a masked entry underflows
    to exactly 0. An added bias cannot overwrite a NaN or inf score: that is safe only because every
    public kernel hands these paths finite keys and values (``_finite.guard_nonfinite``), as it must
    anyway for SDPA, which adds its mask the same way. bool -> float goes through uint8, which is faster.
    """
    return mask.view(torch.uint8).to(dtype).mul_(torch.finfo(dtype).min / 2)


def band_layout(n: int, blk: int, nb: int, before: int, after: int, perm: torch.Tensor | None,
                lengths: torch.Tensor | None, device, *, lead: int, rows: int, width: int, skip_recent: int = 0):
    """Where one band's query slots and key rows come from, and its mask.

    Returns (q_src (Bp, nb*blk), k_src (Bp, rows), blocked (Bp, nb, blk, width)): the token held by each
    padded query slot and by each key row, key row ``j`` being slot ``j - lead``. Padding points at a real
    token and is masked (keys) or cropped (queries). ``perm``, ``lengths`` as in ``banded_attention``.
    """
    q_slots = torch.arange(nb * blk, device=device)
    k_slots = torch.arange(rows, device=device) - lead
    if perm is None:
        q_src = q_slots.clamp(max=n - 1).view(1, -1)
        k_src = k_slots.clamp(0, n - 1).view(1, -1)
        blocked = _blocked(n, blk, nb, before, after, None, None, None, device, lead=lead, width=width)
        return q_src, k_src, blocked
    if lengths is None and n < before + after + 1:
        lengths = torch.full((1,), n, device=device)  # the band covers the row more than once
    perm = perm.view(-1, n)
    q_src = perm[:, q_slots.clamp(max=n - 1)]
    if lengths is None:
        k_src = perm[:, k_slots % n]
    else:
        lengths = lengths.view(-1, 1).clamp(min=1)
        table = perm.expand(max(perm.shape[0], lengths.shape[0]), n)
        k_src = table.gather(1, torch.remainder(k_slots.view(1, -1), lengths).expand(table.shape[0], -1))
    # perm holds original positions, so the key rows' positions are the key indices themselves
    blocked = _blocked(n, blk, nb, before, after, perm, k_src, lengths, device, skip_recent, lead=lead, width=width)
    return q_src, k_src, blocked


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, H, n, d) gathered along n by index (1, L) or (B, L) -> (B, H, L, d); one copy."""
    B, H, n, d = x.shape
    if index.shape[0] == 1:
        return x.index_select(2, index[0])
    rows = index.unsqueeze(1) + (torch.arange(B * H, device=x.device) * n).view(B, H, 1)
    return x.reshape(B * H * n, d).index_select(0, rows.flatten()).view(B, H, -1, d)


def fused_forward_applies(q, k, v) -> bool:
    """Forward-only work on CPU goes to SDPA's fused kernel; training keeps the hand-written backward."""
    if q.device.type != "cpu":
        return False  # CUDA defaults to FlexAttention; the fused window path is measured on CPU only
    return not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))


def sdpa_lse(q, k, v, *, causal: bool, scale: float, attn_mask=None):
    """SDPA's fused CPU kernel, returning the output and the log-sum-exp of each query's scores.
    4-D inputs (batch, heads, len, d) with any strides; GQA when k has fewer heads than q."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=attn_mask, scale=scale)
