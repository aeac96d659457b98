"""The O(n*w) kernels in plain PyTorch: a blocked banded kernel and a dense one for short sequences.

Both are pure functions of tensors, differentiable by autograd on any device. Neither knows which
variant it serves: SWA is a one-sided band, SA is a circular band in slot space plus a causal test on
the tokens' original positions.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_HALF = (torch.float16, torch.bfloat16)


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _HALF else dtype


def _fold_groups(q: torch.Tensor, hkv: int, nb: int, blk: int) -> torch.Tensor:
    """(B, Hq, nb*blk, d) -> (B, Hkv, nb, G*blk, d): a kv head's query heads share one matmul."""
    B, Hq, _, d = q.shape
    G = Hq // hkv
    q = q.view(B, hkv, G, nb, blk, d)
    return q.transpose(2, 3).reshape(B, hkv, nb, G * blk, d)


def _unfold_groups(y: torch.Tensor, hq: int, n: int) -> torch.Tensor:
    """Inverse of ``_fold_groups``, cropped to n."""
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
             k_pos: torch.Tensor | None, lengths: torch.Tensor | None, device, skip_recent: int = 0) -> torch.Tensor:
    """(Bp, nb, blk, W) bool: True where query ``r`` of block ``i`` must not read window column ``u``.

    Column ``u`` of block ``i`` is key slot ``i*blk - before + u``. Without positions (SWA) the band
    is clipped at the sequence ends; with them (SA) the band is circular and a key is read only if
    its original position ``k_pos`` is not after the query's ``q_pos``. ``lengths`` (B, 1) marks the
    circular band of a row shorter than the band: offsets that wrap onto a slot already in the band
    are dropped, so no key is read twice. ``skip_recent`` also drops keys with 0 <= q_pos - k_pos <
    skip_recent: the SWA window that the union of SA and SWA reads in its other part.
    """
    W = blk + before + after
    r = torch.arange(blk, device=device).view(blk, 1)
    u = torch.arange(W, device=device).view(1, W)
    blocked = ((u < r) | (u > r + before + after)).expand(nb, blk, W)  # outside before >= s - t >= -after
    if q_pos is None:
        t = torch.arange(nb, device=device).view(nb, 1) * blk - before + u
        return (blocked | ((t < 0) | (t >= n)).view(nb, 1, W)).unsqueeze(0)
    pad = nb * blk - n
    # Padded query slots get position -1 so they read nothing real; they are cropped anyway.
    pos_q = F.pad(q_pos, (0, pad), value=-1).view(-1, nb, blk, 1)
    pos_k = k_pos.unfold(1, W, blk).unsqueeze(2)  # (Bp, nb, 1, W)
    blocked = blocked.unsqueeze(0) | (pos_k > pos_q)
    if skip_recent:
        blocked = blocked | (pos_q - pos_k < skip_recent)
    if lengths is not None:
        blocked = blocked | ((u - r).view(1, 1, blk, W) >= lengths.view(-1, 1, 1, 1))
    return blocked


class _BlockedSoftmaxAttention(torch.autograd.Function):
    """softmax(Q K^T, masked) V over a batch of (query block, key window) pairs.

    Written out so that backward is exactly four bmm and one softmax-backward over the window
    scores, with no layout copies: this is what keeps SA and SWA at O(n*w) with a small constant.
    q (N, M, d) is pre-scaled; k, v (N, W, d); ``blocked`` broadcasts against the scores viewed as
    ``score_view`` and marks the pairs to mask.
    """

    @staticmethod
    def forward(ctx, q, k, v, blocked, score_view):
        sdt = _softmax_dtype(q.dtype)
        scores = torch.bmm(q, k.transpose(1, 2)).to(sdt)
        # Masking by adding a large negative bias is branch-free: masked_fill_ with SA's scattered
        # causal mask runs 4-10x slower on CPU (branch misprediction). The bias is finite, so fully
        # masked padding rows stay free of NaN; exp() of a masked entry underflows to exactly 0.
        bias = blocked.to(sdt).mul_(torch.finfo(sdt).min / 2)
        scores.view(score_view).add_(bias)
        del bias
        probs = torch.softmax(scores, dim=-1)
        del scores
        out = torch.bmm(probs.to(v.dtype), v)
        ctx.save_for_backward(q, k, v, probs)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        p = probs.to(v.dtype)
        grad_v = torch.bmm(p.transpose(1, 2), grad_out)
        grad_p = torch.bmm(grad_out, v.transpose(1, 2)).to(probs.dtype)
        grad_s = torch._softmax_backward_data(grad_p, probs, -1, probs.dtype).to(q.dtype)
        del grad_p
        grad_q = torch.bmm(grad_s, k)
        grad_k = torch.bmm(grad_s.transpose(1, 2), q)
        return grad_q, grad_k, grad_v, None, None


def _take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, H, n, d) gathered along n by index (1, L) or (B, L) -> (B, H, L, d); one copy."""
    B, H, n, d = x.shape
    if index.shape[0] == 1:
        return x.index_select(2, index[0])
    rows = index.unsqueeze(1) + (torch.arange(B * H, device=x.device) * n).view(B, H, 1)
    return x.reshape(B * H * n, d).index_select(0, rows.flatten()).view(B, H, -1, d)


def banded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    before: int,
    after: int,
    scale: float,
    perm: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    block: int | None = None,
    skip_recent: int = 0,
    return_lse: bool = False,
    inv: torch.Tensor | None = None,
):
    """Banded attention in O(n*(before+after)): query slot s reads key slots s-before .. s+after.

    Without ``perm`` the slots are the tokens (SWA: before = w-1, after = 0). With a gather-index
    ``perm`` (1 or B, n) slot s holds token perm[s], the band wraps around the sequence end, and a
    key is read only if it is causal in original positions (SA). ``lengths`` (B,) makes row b's band
    wrap at its first lengths[b] slots instead of n, so the slots after them (padding) are never
    read. Both cases run the same gathers and matmuls; only the indices and the mask differ. q is
    (B, Hq, n, d), k and v (B, Hkv, n, d); the output is in token order.

    ``return_lse`` also returns the log-sum-exp of each query's scores (B, Hq, n), so that two
    disjoint key sets can be merged into one softmax (``skip_recent`` makes SA's set disjoint from
    SWA's); that path is differentiated by autograd instead of the hand-written backward.

    ``inv`` is ``perm``'s inverse (token -> slot), if the caller has it precomputed (the paper
    precomputes both sigma and sigma^-1 as index tensors); otherwise it is computed here.
    """
    B, Hq, n, d = q.shape
    circular = perm is not None
    if circular and lengths is None and n < before + after + 1:
        lengths = torch.full((1,), n, device=q.device)  # the band covers the row more than once
    blk = block or default_block(before + after + 1)
    nb = -(-n // blk)
    W = blk + before + after
    dev = q.device

    # Token held by each padded query slot and key-window column; padding points at a real token and
    # is masked (keys) or cropped (queries).
    q_slots = torch.arange(nb * blk, device=dev)
    k_slots = torch.arange(nb * blk + before + after, device=dev) - before
    if circular:
        perm = perm.view(-1, n)
        q_src = perm[:, q_slots.clamp(max=n - 1)]
        if lengths is None:
            k_src = perm[:, k_slots % n]
        else:
            lengths = lengths.view(-1, 1).clamp(min=1)
            rows = perm.expand(max(perm.shape[0], lengths.shape[0]), n)
            k_src = rows.gather(1, torch.remainder(k_slots.view(1, -1), lengths).expand(rows.shape[0], -1))
        # perm holds original positions, so the key windows' positions are the key indices themselves
        blocked = _blocked(n, blk, nb, before, after, perm, k_src, lengths, dev, skip_recent)
    else:
        q_src = q_slots.clamp(max=n - 1).view(1, -1)
        k_src = k_slots.clamp(0, n - 1).view(1, -1)
        blocked = _blocked(n, blk, nb, before, after, None, None, None, dev)

    if not circular:
        inv = None
    elif inv is None:  # token i sits in slot inv[i]
        from .permutation import invert_permutation

        inv = invert_permutation(perm)
    else:
        inv = inv.view(-1, n)
    if _fused_forward_applies(q, k, v):
        return _fused_window_forward(q, k, v, q_src, k_src, inv, blocked, scale, blk, W, return_lse)
    out, lse = _autograd_window_attention(q, k, v, q_src, k_src, blocked, scale, blk, W, return_lse)
    out = out[:, :, :n]
    if return_lse:
        lse = lse[:, :, :n]
    if circular:  # back to token order
        out = _take_rows(out, inv)
        if return_lse:
            lse = _take_rows(lse.unsqueeze(-1), inv).squeeze(-1)
    return (out, lse) if return_lse else out


def _fused_forward_applies(q, k, v) -> bool:
    """Forward-only work on CPU goes to SDPA's fused kernel; training keeps the hand-written backward."""
    if q.device.type != "cpu":
        return False  # CUDA defaults to FlexAttention; the fused window path is measured on CPU only
    return not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))


def _sdpa_lse(q, k, v, *, causal: bool, scale: float, attn_mask=None):
    """SDPA's fused CPU kernel, returning the output and the log-sum-exp of each query's scores.
    4-D inputs (batch, heads, len, d) with any strides; GQA when k has fewer heads than q."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=attn_mask, scale=scale)


def _fused_window_forward(q, k, v, q_src, k_src, inv, blocked, scale, blk, W, return_lse):
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
    ks, vs = _take_rows(k, k_src).contiguous(), _take_rows(v, k_src).contiguous()
    L = ks.shape[2]
    qs = _take_rows(q, q_src).contiguous()  # (B, Hq, nb*blk, d)
    bias = blocked.to(q.dtype).mul_(torch.finfo(q.dtype).min / 2).unsqueeze(2)  # (Bp, nb, 1, blk, W)
    out = q.new_empty(B, n, Hq, d)
    lse = q.new_empty(B, n, Hq, dtype=_softmax_dtype(q.dtype)) if return_lse else None  # SDPA's lse dtype
    for b in range(B):
        qb = qs[b].view(Hq, nb, blk, d).transpose(0, 1)  # (nb, Hq, blk, d), a view
        kb = ks[b].as_strided((nb, Hkv, W, d), (blk * d, L * d, d, 1), ks[b].storage_offset())
        vb = vs[b].as_strided((nb, Hkv, W, d), (blk * d, L * d, d, 1), vs[b].storage_offset())
        mask = bias[b if bias.shape[0] > 1 else 0]
        if return_lse:
            ob, lb = _sdpa_lse(qb, kb, vb, causal=False, scale=scale, attn_mask=mask)
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


def _autograd_window_attention(q, k, v, q_src, k_src, blocked, scale, blk, W, return_lse):
    """The differentiable path: every block's key window gathered contiguously, then four bmm."""
    B, Hq, _, d = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    nb = blocked.shape[1]
    dev = q.device
    # One gather lays out every block's key window contiguously: (B*Hkv*nb, W, d), no unfold copy.
    cols = (torch.arange(nb, device=dev) * blk).view(nb, 1) + torch.arange(W, device=dev).view(1, W)
    w_src = k_src[:, cols.flatten()]

    def windows(x: torch.Tensor) -> torch.Tensor:
        return _take_rows(x, w_src).view(B * Hkv * nb, W, d)

    qb = _fold_groups(_take_rows(q, q_src).mul_(scale), Hkv, nb, blk).reshape(B * Hkv * nb, G * blk, d)
    view = (B, Hkv, nb, G, blk, W)
    mask = blocked.view(-1, 1, nb, 1, blk, W)
    if return_lse:
        out, lse = _softmax_with_lse(qb, windows(k), windows(v), mask, view)
        lse = _unfold_groups(lse.view(B, Hkv, nb, G * blk, 1), Hq, nb * blk).squeeze(-1)
    else:
        out, lse = _BlockedSoftmaxAttention.apply(qb, windows(k), windows(v), mask, view), None
    return _unfold_groups(out.view(B, Hkv, nb, G * blk, d), Hq, nb * blk), lse


def _softmax_with_lse(q, k, v, blocked, score_view):
    """As ``_BlockedSoftmaxAttention.forward``, plus the scores' log-sum-exp; plain autograd ops."""
    sdt = _softmax_dtype(q.dtype)
    scores = torch.bmm(q, k.transpose(1, 2)).to(sdt)
    scores = (scores.view(score_view) + blocked.to(sdt) * (torch.finfo(sdt).min / 2)).view(scores.shape)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    out = torch.bmm(torch.exp(scores - lse).to(v.dtype), v)
    return out, lse


def dense_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                           *, scale: float) -> torch.Tensor:
    """Masked softmax attention with an explicit (Bm, Hm, n, n) bool mask; for short sequences only."""
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv
    qg = (q * scale).reshape(B, Hkv, G * n, d)  # q may be a transposed view (the model's heads)
    scores = torch.matmul(qg, k.transpose(-1, -2)).to(_softmax_dtype(q.dtype)).view(B, Hkv, G, n, n)
    if mask.shape[1] == 1:
        mask = mask.view(mask.shape[0], 1, 1, n, n)
    else:
        mask = mask.view(mask.shape[0], Hkv, G, n, n)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(B, Hkv, G * n, n)
    return torch.matmul(probs, v).view(B, Hq, n, d)
