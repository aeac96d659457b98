"""The O(n*w) kernels in plain PyTorch: a blocked banded kernel and a dense one for short sequences.

Both are pure functions of tensors, differentiable by autograd on any device. Neither knows which
variant it serves: SWA is a one-sided band, SA is a circular band in slot space plus a causal test on
the tokens' original positions.
"""
from __future__ import annotations

from dataclasses import dataclass

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
             k_pos: torch.Tensor | None, lengths: torch.Tensor | None, device, skip_recent: int = 0, *,
             lead: int, width: int) -> torch.Tensor:
    """(Bp, nb, blk, W) bool: True where query ``r`` of block ``i`` must not read window column ``u``.

    Column ``u`` of block ``i`` is key slot ``i*blk - lead + u``, for a window of ``width`` columns; the
    band's own reach is lead = before, W = blk + before + after, and a wider window masks its extra columns. Without positions (SWA) the band is clipped at the sequence ends; with them
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


def _mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Scores' additive mask: 0 where ``mask`` is False, a large finite negative where it is True.

    Adding a bias is branch-free: masked_fill_ with SA's scattered causal mask runs 4-10x slower on CPU
    (branch misprediction). Setting the masked scores instead would cost 6% of SA's forward and backward at
    n=2048, w=64 even done branch-free on their bits ((s & keep) | fill, two passes; 2.4% with 4:1 GQA), and
    masked_fill costs 4% of the union's. The bias is finite, so fully masked padding rows stay free of NaN;
    exp() of a masked entry underflows to exactly 0. An added bias cannot overwrite a NaN or inf score: that
    is safe only because every public kernel hands these paths finite keys and values
    (``_finite.guard_nonfinite``), as it must anyway for SDPA, which adds its mask the same way. bool ->
    float is several times faster through uint8.
    """
    return mask.view(torch.uint8).to(dtype).mul_(torch.finfo(dtype).min / 2)


def _band_layout(n: int, blk: int, nb: int, before: int, after: int, perm: torch.Tensor | None,
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

    Three paths, one semantics: training runs ``multi_band_attention``'s in-place window kernel with one
    band (the one gated SA+SWA runs with two); forward-only work on CPU runs SDPA's fused kernel over each
    block's window; ``return_lse`` also returns the log-sum-exp of each query's scores (B, Hq, n), so that
    two disjoint key sets can be merged into one softmax (``skip_recent`` makes SA's set disjoint from
    SWA's), and is differentiated by autograd.

    ``inv`` is ``perm``'s inverse (token -> slot), if the caller has it precomputed (the paper
    precomputes both sigma and sigma^-1 as index tensors); otherwise it is computed here.
    """
    B, Hq, n, d = q.shape
    circular = perm is not None
    if circular:
        perm = perm.view(-1, n)
    if not (return_lse or skip_recent or _fused_forward_applies(q, k, v)):
        # training: the in-place window kernel (no window copies), the same one gated SA+SWA runs on
        return multi_band_attention(q, k, v, [Band(before, after, perm, inv, lengths)], scale=scale, block=block)[0]
    blk = block or default_block(before + after + 1)
    nb = -(-n // blk)
    W = blk + before + after
    dev = q.device

    q_src, k_src, blocked = _band_layout(n, blk, nb, before, after, perm, lengths, dev, lead=before,
                                         rows=nb * blk + before + after, width=W, skip_recent=skip_recent)
    if not circular:
        inv = None
    elif inv is None:  # token i sits in slot inv[i]
        inv = _inverse(perm)
    else:
        inv = inv.view(-1, n)
    if _fused_forward_applies(q, k, v):
        return _fused_window_forward(q, k, v, q_src, k_src, inv, blocked, scale, blk, W, return_lse)
    out, lse = _autograd_window_attention(q, k, v, q_src, k_src, blocked, scale, blk, W)
    out, lse = out[:, :, :n], lse[:, :, :n]
    if circular:  # back to token order
        out = _take_rows(out, inv)
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
    bias = _mask_bias(blocked, q.dtype).unsqueeze(2)  # (Bp, nb, 1, blk, W)
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


def _autograd_window_attention(q, k, v, q_src, k_src, blocked, scale, blk, W):
    """The differentiable path with log-sum-exp (the union's two key sets): every block's key window gathered
    contiguously, then plain autograd ops. Returns out (B, Hq, nb*blk, d) and lse (B, Hq, nb*blk)."""
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
    out, lse = _softmax_with_lse(qb, windows(k), windows(v), blocked.view(-1, 1, nb, 1, blk, W),
                                 (B, Hkv, nb, G, blk, W))
    lse = _unfold_groups(lse.view(B, Hkv, nb, G * blk, 1), Hq, nb * blk).squeeze(-1)
    return _unfold_groups(out.view(B, Hkv, nb, G * blk, d), Hq, nb * blk), lse


def _softmax_with_lse(q, k, v, blocked, score_view):
    """softmax(q k^T, masked) v over (query block, key window) pairs, plus the scores' log-sum-exp."""
    sdt = _softmax_dtype(q.dtype)
    scores = torch.bmm(q, k.transpose(1, 2)).to(sdt)
    scores = (scores.view(score_view) + _mask_bias(blocked, sdt)).view(scores.shape)  # finite k, v (_mask_bias)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    out = torch.bmm(torch.exp(scores - lse).to(v.dtype), v)
    return out, lse


@dataclass(frozen=True)
class Band:
    """One path of ``multi_band_attention``: query slot s reads key slots s-before .. s+after.

    ``perm`` (1 or B, n), ``inv`` and ``lengths`` (B,) mean what they mean for ``banded_attention``;
    without ``perm`` the slots are the tokens and the band is clipped at the sequence ends.
    """

    before: int
    after: int
    perm: torch.Tensor | None = None
    inv: torch.Tensor | None = None
    lengths: torch.Tensor | None = None


def multi_band_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bands: list[Band], *, scale: float,
                         block: int | None = None) -> list[torch.Tensor]:
    """Several bands over the same q, k, v in one pass: one output (B, Hq, n, d) per band, in token order.

    Each band gives exactly what ``banded_attention`` gives with its arguments. The bands share one
    query block size and one window width (the widest band's, in whole blocks; a narrower band masks
    its extra columns), so one gather lays out every band's queries, one lays out every band's keys
    (and one its values) in slot order, and one ``_WindowAttention`` runs over all their windows, which
    it reads in place. ``banded_attention`` trains through it with one band. Two bands cost about twice
    one (1.96x at n=8192, w=256 on CPU; docs/benchmarks.md): each band's matmuls are its own, and the
    shared gathers are a small part of the time.
    """
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    blk = block or default_block(max(b.before + b.after + 1 for b in bands))
    nb = -(-n // blk)
    leads, widths = zip(*(band_window(b.before, b.after, blk) for b in bands))
    M = max(widths) // blk  # window width in blocks
    nbm = nb + M - 1  # windows per (batch row, kv head, band): nb with queries, then M - 1 spare ones
    layouts = [_band_layout(n, blk, nb, b.before, b.after, None if b.perm is None else b.perm.view(-1, n),
                            b.lengths, q.device, lead=lead, rows=nbm * blk, width=M * blk)
               for b, lead in zip(bands, leads)]
    qw, kb, vb = _window_rows(q, k, v, layouts, nbm, blk, scale)
    blocked, mask_rows, steps = _mask_plan(layouts, B, Hkv, nbm, qw.shape[1] * M * blk, q.device)
    out = _WindowAttention.apply(qw, kb, vb, blocked, mask_rows, blk, steps)
    return _token_order(out, bands, B, Hq, Hkv, n, nbm, blk)


def band_window(before: int, after: int, blk: int) -> tuple[int, int]:
    """(lead, width) of a query block's key window for a band: the window starts ``lead`` slots before
    the block, on a block boundary, and is ``width`` slots wide, a whole number of blocks."""
    lead = -(-before // blk) * blk
    return lead, -(-(lead + blk + after) // blk) * blk


def _window_rows(q, k, v, layouts, nbm: int, blk: int, scale: float):
    """q, k and v laid out for ``_WindowAttention``, in (batch row, kv head, band) runs of nbm windows.

    Returns queries (B*Hkv*P*nbm, G*blk, d), scaled, and keys and values (rows, d), where window i of
    the whole layout reads key rows i*blk .. i*blk + W - 1. The spare query rows read token 0 and the
    last spare windows read past the end (the padding rows): nothing reads their outputs, so their
    gradient is zero.
    """
    B, Hq, n, d = q.shape
    Hkv, P, dev = k.shape[1], len(layouts), q.device
    G, spare = Hq // Hkv, nbm * blk - layouts[0][0].shape[1]
    q_tok = torch.stack([F.pad(qs, (0, spare)).expand(B, -1) for qs, _, _ in layouts], 1)
    k_tok = torch.stack([ks.expand(B, -1) for _, ks, _ in layouts], 1)
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    heads = torch.arange(Hq, device=dev).view(1, Hkv, 1, 1, G, 1)  # query head h*G + g reads kv head h
    q_rows = ((b.view(B, 1, 1, 1, 1, 1) * Hq + heads) * n + q_tok.view(B, 1, P, nbm, 1, blk)).flatten()
    kv_heads = torch.arange(Hkv, device=dev).view(1, Hkv, 1, 1)
    k_rows = F.pad(((b * Hkv + kv_heads) * n + k_tok.view(B, 1, P, nbm * blk)).flatten(), (0, spare))
    qw = q.reshape(-1, d).index_select(0, q_rows).mul_(scale).view(-1, G * blk, d)
    return qw, k.reshape(-1, d).index_select(0, k_rows), v.reshape(-1, d).index_select(0, k_rows)


def _mask_plan(layouts, B: int, Hkv: int, nbm: int, window_scores: int, device):
    """The masks of every window, and the window ranges that ``_WindowAttention`` computes.

    Returns ``blocked`` (Bm*P*(nb+1), blk, W), each band's nb block masks and then an unmasked one for
    its spare windows; ``mask_rows``, the row of ``blocked`` for each window; and the steps (s, e, row),
    where ``row`` is the mask of window s when the range's masks are consecutive rows, else None.
    """
    P, Bm, nb = len(layouts), max(bl.shape[0] for _, _, bl in layouts), layouts[0][2].shape[1]
    blocked = torch.stack([F.pad(bl, (0, 0, 0, 0, 0, 1)).expand(Bm, -1, -1, -1) for _, _, bl in layouts], 1)

    def row(b, p, j):  # window j of band p in batch row b; ints or broadcastable tensors
        return ((b if Bm > 1 else 0) * P + p) * (nb + 1) + j

    mask_rows = row(torch.arange(B, device=device).view(B, 1, 1, 1), torch.arange(P, device=device).view(1, 1, P, 1),
                    torch.arange(nbm, device=device).clamp(max=nb)).expand(B, Hkv, P, nbm).flatten()
    steps = [(s, e, row(s // nbm // (Hkv * P), s // nbm % P, s % nbm) if e <= s // nbm * nbm + nb else None)
             for s, e in _steps(B * Hkv * P, nb, nbm, window_scores, device)]
    return blocked.flatten(0, 2), mask_rows, steps


def _token_order(out, bands, B: int, Hq: int, Hkv: int, n: int, nbm: int, blk: int) -> list[torch.Tensor]:
    """Each band's output (B, Hq, n, d), read from the windows' rows in one gather: token t sits in
    slot inv[t] of its band, which is row t % blk of window t // blk, among its query head's rows."""
    d, dev, P, G = out.shape[-1], out.device, len(bands), Hq // Hkv
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h, g = torch.arange(Hkv, device=dev).view(1, Hkv, 1, 1), torch.arange(G, device=dev).view(1, 1, G, 1)
    rows = []
    for p, band in enumerate(bands):
        if band.perm is None:
            slot = torch.arange(n, device=dev)
        else:
            slot = band.inv if band.inv is not None else _inverse(band.perm.view(-1, n))
        slot = slot.view(-1, 1, 1, n)
        window = ((b * Hkv + h) * P + p) * nbm + slot // blk
        rows.append(((window * G + g) * blk + slot % blk).expand(B, Hkv, G, n).flatten())
    ys = out.view(-1, d).index_select(0, torch.cat(rows))
    return list(ys.view(P, B, Hq, n, d).unbind(0))


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    from .permutation import invert_permutation

    return invert_permutation(perm)


def _windows(x: torch.Tensor, count: int, width: int, blk: int) -> torch.Tensor:
    """(count, width, d) overlapping view of the rows of x (R, d): window i is rows i*blk .. i*blk + width - 1."""
    d = x.shape[1]
    return x.as_strided((count, width, d), (blk * d, d, 1), x.storage_offset())


def _fold_windows(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, blk: int) -> None:
    """Adds a_i^T b_i, the (width, d) gradient of window i, to blocks i .. i + width/blk - 1 of out
    (count + width/blk - 1, blk, d): the gradient of ``_windows``. One batched matmul per block of
    the window, accumulated in place, so no (count, width, d) tensor is built. a is (count, m, width),
    b (count, m, d)."""
    count, _, width = a.shape
    for j in range(width // blk):
        out[j:j + count].baddbmm_(a[:, :, j * blk:(j + 1) * blk].transpose(1, 2), b)


#: Scores per step of ``_WindowAttention`` on CPU (2 MiB in fp32, about one core's L2): a step's
#: scores, probabilities and their gradients stay in cache. 32 windows of 64 x 320 at d=64.
_STEP_SCORES = 1 << 19


def _steps(segments: int, real: int, stride: int, window_scores: int, device) -> list[tuple[int, int]]:
    """Window ranges [s, e) that ``_WindowAttention`` computes, one at a time.

    Windows come in ``segments`` runs of ``stride``, of which the first ``real`` hold queries. On CPU a
    range holds about ``_STEP_SCORES`` scores within one run, so the spare windows are skipped; elsewhere
    one range covers them all, spare windows included.
    """
    if device.type != "cpu":
        return [(0, segments * stride)]
    step = max(1, _STEP_SCORES // window_scores)
    return [(seg * stride + i, seg * stride + min(i + step, real)) for seg in range(segments)
            for i in range(0, real, step)]


def _gaps(steps, count: int) -> list[tuple[int, int]]:
    """The ranges of [0, count) that no step covers (steps are in order and disjoint)."""
    ends = [0] + [e for _, e, _ in steps]
    starts = [s for s, _, _ in steps] + [count]
    return [(e, s) for e, s in zip(ends, starts) if s > e]


class _WindowAttention(torch.autograd.Function):
    """softmax(Q K^T, masked) V for windows of queries against overlapping windows of one key buffer.

    Query window i (N, m, d), pre-scaled, reads rows i*blk .. i*blk + W - 1 of k and v (R, d), as a
    strided view of the buffer: the windows are never copied, neither in forward nor as gradients.
    ``blocked`` (Mb, blk, W) holds the masks and window i is masked by ``blocked[mask_rows[i]]``,
    broadcast over its m / blk query heads. ``steps`` (s, e, row) are the window ranges to compute, one
    at a time (see ``_steps``): on CPU a few windows each, so that a step's scores and their gradients
    stay in cache; ``row``, if not None, says that the range's masks are rows row .. row + e - s - 1.
    Windows outside every range are skipped: their output is left unset and their gradient is zero.
    """

    @staticmethod
    def forward(ctx, q, k, v, blocked, mask_rows, blk, steps):
        N, m, d = q.shape
        W = blocked.shape[-1]
        kw, vw = _windows(k, N, W, blk), _windows(v, N, W, blk)
        sdt = _softmax_dtype(q.dtype)
        out = q.new_empty(N, m, d)  # rows of windows that no step computes are never read
        probs = []
        for s, e, row in steps:
            scores = torch.bmm(q[s:e], kw[s:e].transpose(1, 2)).to(sdt)
            mask = blocked[row:row + e - s] if row is not None else blocked.index_select(0, mask_rows[s:e])
            bias = _mask_bias(mask, sdt)  # finite keys and values only (see _mask_bias)
            scores.view(e - s, m // blk, blk, W).add_(bias.unsqueeze(1))
            del bias
            p = torch.softmax(scores, dim=-1)
            del scores
            torch.bmm(p.to(v.dtype), vw[s:e], out=out[s:e])
            probs.append(p)
        ctx.blk, ctx.steps = blk, steps
        ctx.save_for_backward(q, k, v, *probs)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, *probs = ctx.saved_tensors
        blk, (N, _, d), W = ctx.blk, q.shape, probs[0].shape[-1]
        kw, vw = _windows(k, N, W, blk), _windows(v, N, W, blk)
        grad_out = grad_out.contiguous()
        grad_q = torch.empty_like(q)
        for s, e in _gaps(ctx.steps, N):  # the spare windows' queries still get a (zero) gradient
            grad_q[s:e].zero_()
        grad_k = k.new_zeros(k.shape[0] // blk, blk, d)
        grad_v = v.new_zeros(v.shape[0] // blk, blk, d)
        reach = W // blk - 1
        for (s, e, _), p in zip(ctx.steps, probs):
            go = grad_out[s:e]
            grad_p = torch.bmm(go, vw[s:e].transpose(1, 2)).to(p.dtype)
            grad_s = torch._softmax_backward_data(grad_p, p, -1, p.dtype).to(q.dtype)
            del grad_p
            torch.bmm(grad_s, kw[s:e], out=grad_q[s:e])
            _fold_windows(grad_k[s:e + reach], grad_s, q[s:e], blk)
            del grad_s
            _fold_windows(grad_v[s:e + reach], p.to(v.dtype), go, blk)
        return grad_q, grad_k.view(k.shape), grad_v.view(v.shape), None, None, None, None


def dense_masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                           *, scale: float, return_lse: bool = False):
    """Masked softmax attention with an explicit (Bm, Hm, n, m) bool mask (m keys: n for self-attention);
    for short sequences and small key sets only. ``return_lse`` also returns each query's log-sum-exp
    (B, Hq, n), -inf for a query that reads no key (its output is then 0), so partial softmaxes merge."""
    B, Hq, n, d = q.shape
    Hkv, m = k.shape[1], k.shape[2]
    G = Hq // Hkv
    qg = (q * scale).reshape(B, Hkv, G * n, d)  # q may be a transposed view (the model's heads)
    scores = torch.matmul(qg, k.transpose(-1, -2)).to(_softmax_dtype(q.dtype)).view(B, Hkv, G, n, m)
    if mask.shape[1] == 1:
        mask = mask.reshape(mask.shape[0], 1, 1, n, m)
    else:
        mask = mask.reshape(mask.shape[0], Hkv, G, n, m)
    if return_lse:
        scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse)).to(v.dtype).view(B, Hkv, G * n, m)
        return torch.matmul(probs, v).view(B, Hq, n, d), lse.view(B, Hq, n)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1).to(v.dtype).view(B, Hkv, G * n, m)
    return torch.matmul(probs, v).view(B, Hq, n, d)


def merge_partials(y_a: torch.Tensor, lse_a: torch.Tensor, y_b: torch.Tensor, lse_b: torch.Tensor):
    """One softmax over two disjoint key sets, from each set's output and log-sum-exp (B, Hq, n): returns
    the merged output in y_a's dtype (merged in fp32 for half inputs) and the merged log-sum-exp."""
    acc = torch.promote_types(y_a.dtype, torch.float32)
    top = torch.maximum(lse_a, lse_b).to(acc)
    a, b = torch.exp(lse_a.to(acc) - top).unsqueeze(-1), torch.exp(lse_b.to(acc) - top).unsqueeze(-1)
    y = ((a * y_a.to(acc) + b * y_b.to(acc)) / (a + b)).to(y_a.dtype)
    return y, top + torch.log((a + b).squeeze(-1))
