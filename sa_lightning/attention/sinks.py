"""Attention sinks (StreamingLLM, beyond the paper) and the keys a variant's mask attends.

**Sinks.** With ``sink = k``, query i also reads the first k tokens of its row: key j is visible when the
variant's own mask allows it, or when j < k and j <= i. The variant runs its own O(n*w) kernel and returns
its log-sum-exp (``Variant.kernel_with_lse``); the sink keys it did not already read are scored apart,
(n x k), and merged into the same softmax by log-sum-exp, so no key counts twice and nothing n x n is
built. Any variant with a kernel with log-sum-exp and a mask takes sinks.

**Budget.** :func:`keys_attended` counts, from the same masks the kernels use, how many keys the queries of
an input attend: the x-axis of the equal-budget comparison (SA∪SWA at w reads more keys than SWA at w).

Rows follow the kernels' padding convention: row b's valid tokens come first, ``lengths[b]`` of them.
"""
from __future__ import annotations

import torch

from .dense import dense_masked_attention, merge_partials


def attend_with_sinks(variant, call):
    """(output, log-sum-exp) of ``variant``'s single path on a checked ``call``, with the first ``call.spec.sink``
    keys of each row added (none: the variant's own). Computes only: ``Variant.__call__`` checks and guards."""
    q, k, v = call.q, call.k, call.v
    B, _, n, _ = q.shape
    y, lse = variant.kernel_with_lse(call)
    s = min(call.spec.sink, n)
    if s == 0:
        return y, lse
    # the sink keys each query does not already read: (B, 1, n, s)
    b = torch.arange(B, device=q.device).view(-1, 1, 1, 1)
    qi = torch.arange(n, device=q.device).view(1, 1, n, 1)
    kj = torch.arange(s, device=q.device).view(1, 1, 1, s)
    own = variant.mask(call.spec, n, call.perm, call.lengths)
    extra = (kj <= qi) & ~own(b, 0, qi, kj)
    y_s, lse_s = dense_masked_attention(q, k[:, :, :s], v[:, :, :s], extra, scale=call.scale, return_lse=True)
    return merge_partials(y, lse, y_s, lse_s)


# ---- the budget: keys each query attends ---------------------------------------------------------
def causal_keys(length: int, window: int | None = None) -> int:
    """Sum over queries i < length of min(i + 1, window): causal full attention, or SWA at ``window``."""
    if window is None or length <= window:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def keys_attended(variant, spec, n: int, *, perm: torch.Tensor | None = None, lengths: torch.Tensor | None = None,
                  batch: int = 1) -> tuple[int, int]:
    """(keys attended, queries) summed over the valid queries of a (batch, n) input, counted from
    ``variant``'s mask (a ``Variant``; ``perm`` its draw, for the variants that draw), sinks (``spec.sink``) added
    where the variant's own mask does not already hold them."""
    rows = [n] * batch if lengths is None else [int(x) for x in lengths.tolist()]
    keys = 0
    for b, length in enumerate(rows):
        row = variant.draw_row(perm, b)
        keys += variant.keys_attended_row(spec, length, row)
        if spec.sink > 0 and variant.takes_sink:
            keys += _extra_sink_keys(variant, spec, row, length)
    return keys, sum(rows)


def _extra_sink_keys(variant, spec, row: torch.Tensor | None, length: int) -> int:
    """Sink keys (j < sink, j <= i) that the variant's own mask does not already hold, over one row."""
    s = min(spec.sink, length)
    device = None if row is None else row.device
    n = length if row is None or row.dim() == 0 else row.shape[0]  # a hash seed is one number, σ a row of n
    lengths = None if row is None else torch.tensor([length], device=device)
    mask = variant.mask(spec, n, None if row is None else row.unsqueeze(0), lengths)
    qi = torch.arange(length, device=device).view(1, 1, -1, 1)
    kj = torch.arange(s, device=device).view(1, 1, 1, -1)
    zero = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    return int(((kj <= qi) & ~mask(zero, 0, qi, kj)).sum())
