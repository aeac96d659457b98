"""The O(n*w) banded kernel in plain PyTorch: ``banded_attention`` picks one of three paths.

Every path is a pure function of tensors, differentiable on any device, and none knows which variant it
serves: SWA is a one-sided band, SA is a circular band in slot space plus a causal test on the tokens'
original positions. The paths, one module each:

- ``band_inplace``: training; one in-place window kernel with a hand-written backward (also gated SA+SWA's
  two bands in one pass).
- ``band_fused``: forward only on CPU; SDPA's fused kernel over each block's key window, read in place.
- ``band_autograd``: the log-sum-exp path (the union's and the sinks' merges), differentiated by autograd.

``band_common`` holds what they share. Rows shorter than two windows take ``dense``'s explicit mask instead
(the callers in ``functional`` and ``sinks`` choose it).
"""
from __future__ import annotations

import torch

from .band_autograd import autograd_window_attention
from .band_common import band_layout, default_block, fused_forward_applies, take_rows
from .band_fused import fused_window_forward
from .band_inplace import Band, multi_band_attention
from .permutation import invert_permutation


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
    if not (return_lse or skip_recent or fused_forward_applies(q, k, v)):
        # training: the in-place window kernel (no window copies), the same one gated SA+SWA runs on
        return multi_band_attention(q, k, v, [Band(before, after, perm, inv, lengths)], scale=scale, block=block)[0]
    blk = block or default_block(before + after + 1)
    nb = -(-n // blk)
    W = blk + before + after
    dev = q.device

    q_src, k_src, blocked = band_layout(n, blk, nb, before, after, perm, lengths, dev, lead=before,
                                        rows=nb * blk + before + after, width=W, skip_recent=skip_recent)
    if not circular:
        inv = None
    elif inv is None:  # token i sits in slot inv[i]
        inv = invert_permutation(perm)
    else:
        inv = inv.view(-1, n)
    if fused_forward_applies(q, k, v):
        return fused_window_forward(q, k, v, q_src, k_src, inv, blocked, scale, blk, W, return_lse)
    out, lse = autograd_window_attention(q, k, v, q_src, k_src, blocked, scale, blk, W)
    out, lse = out[:, :, :n], lse[:, :, :n]
    if circular:  # back to token order
        out = take_rows(out, inv)
        lse = take_rows(lse.unsqueeze(-1), inv).squeeze(-1)
    return (out, lse) if return_lse else out
