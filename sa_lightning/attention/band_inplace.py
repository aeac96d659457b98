"""The training path of the banded kernels: one in-place window kernel with a hand-written backward.

``multi_band_attention`` runs one or more bands over the same q, k and v: SWA and SA train through it with
one band, gated SA+SWA with two. Each query block's key window is an overlapping strided view of one key
buffer, never copied in forward or as a gradient, and the work goes a cache-sized step of windows at a
time. docs/benchmarks/attention_cpu.md has what this costs against the kernels it replaced.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .band_common import band_layout, default_block, mask_bias, softmax_dtype
from .permutation import invert_permutation


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
    one (figures in docs/benchmarks.md): each band's matmuls are its own, and the shared gathers are a
    small part of the time.
    """
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    blk = block or default_block(max(b.before + b.after + 1 for b in bands))
    nb = -(-n // blk)
    leads, widths = zip(*(band_window(b.before, b.after, blk) for b in bands))
    M = max(widths) // blk  # window width in blocks
    nbm = nb + M - 1  # windows per (batch row, kv head, band): nb with queries, then M - 1 spare ones
    layouts = [band_layout(n, blk, nb, b.before, b.after, None if b.perm is None else b.perm.view(-1, n),
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
            slot = band.inv if band.inv is not None else invert_permutation(band.perm.view(-1, n))
        slot = slot.view(-1, 1, 1, n)
        window = ((b * Hkv + h) * P + p) * nbm + slot // blk
        rows.append(((window * G + g) * blk + slot % blk).expand(B, Hkv, G, n).flatten())
    ys = out.view(-1, d).index_select(0, torch.cat(rows))
    return list(ys.view(P, B, Hq, n, d).unbind(0))


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
        sdt = softmax_dtype(q.dtype)
        out = q.new_empty(N, m, d)  # rows of windows that no step computes are never read
        probs = []
        for s, e, row in steps:
            scores = torch.bmm(q[s:e], kw[s:e].transpose(1, 2)).to(sdt)
            mask = blocked[row:row + e - s] if row is not None else blocked.index_select(0, mask_rows[s:e])
            bias = mask_bias(mask, sdt)  # finite keys and values only (see mask_bias)
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
