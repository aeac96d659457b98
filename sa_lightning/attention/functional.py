"""The public attention functions. Shapes: q (B, Hq, n, d); k, v (B, Hkv, n, d); out like q.

Every function is causal in original token positions. ``backend`` picks the implementation:
``"auto"`` (FlexAttention on CUDA, the banded kernel elsewhere), ``"banded"``, ``"flex"`` or ``"dense"``
(n x n; short sequences and checks only).

Each is one call of its variant (``Variant.__call__``, the one door that checks the inputs, draws or checks σ,
guards non-finite keys and values and adds sinks); the variant's file in ``variants/`` holds its kernel. With the
debug mode on (``check_finite``), a NaN or inf key or value reaches only the rows that see it.
"""
from __future__ import annotations

from . import variants
from .registry import AttentionSpec


def full_attention(q, k, v, *, scale=None):
    """Causal attention over all previous tokens (PyTorch SDPA)."""
    full = variants.FULL
    return full(q, k, v, AttentionSpec(full.name), scale=scale)[0]


def sliding_window_attention(q, k, v, window, *, scale=None, backend="auto"):
    """Query i reads keys j with 0 <= i - j <= window - 1."""
    swa = variants.SWA
    return swa(q, k, v, AttentionSpec(swa.name, window=window, backend=backend), scale=scale)[0]


def stochastic_attention(q, k, v, window, perm=None, *, generator=None, scale=None, backend="auto", lengths=None,
                         inv=None, validate=True):
    """Stochastic Attention: sliding-window attention in a permuted order, causal in original order.

    ``perm`` is a gather index of shape (n,) or (B, n): slot s holds token perm[s]. Query i reads key
    j when j <= i and |slot(i) - slot(j)|_n < window / 2. With ``perm=None`` one permutation is drawn
    from ``generator`` and shared by the batch (one per row, padding in place, when ``lengths`` is given).

    ``lengths`` (B,) is for padded batches: row b's valid tokens must fill its first lengths[b] slots
    (see ``sample_permutation(lengths=...)``). Its circular distance is then taken modulo lengths[b]
    and later slots (padding) are never read, so a row gives what it gives alone; a ``perm`` that puts a
    pad token among a row's first lengths[b] slots is refused. Outputs at padding tokens are finite but
    meaningless (for finite inputs).

    ``validate=False`` skips the value checks of ``perm`` and ``lengths`` (their host syncs): for a caller that
    draws them valid by construction, as the model does in every layer of every step.

    ``inv`` is ``perm``'s inverse (``invert_permutation(perm)``), for callers that precompute sigma and
    sigma^-1 together, as the paper does; it is not checked against ``perm``.
    """
    sa = variants.SA
    return sa(q, k, v, AttentionSpec(sa.name, window=window, backend=backend), perm, lengths, inv,
              validate=validate, scale=scale, generator=generator)[0]


def sa_swa_attention(q, k, v, window, perm=None, *, generator=None, scale=None, backend="auto", lengths=None,
                     inv=None, validate=True):
    """Both paths of gated SA+SWA: returns (y_sa, y_swa), each exactly what ``stochastic_attention`` and
    ``sliding_window_attention`` return for these arguments (``perm``, ``generator``, ``lengths``, ``inv``
    and ``backend`` as there; SA's path reads one permutation, drawn here when ``perm`` is None). On the banded
    backend with gradients both bands run in one pass (``variants/sa_swa.py``)."""
    sa_swa = variants.SA_SWA
    return sa_swa(q, k, v, AttentionSpec(sa_swa.name, window=window, backend=backend), perm, lengths, inv,
                  validate=validate, scale=scale, generator=generator)


def sa_swa_union_attention(q, k, v, window, perm=None, *, generator=None, scale=None, lengths=None, inv=None,
                           return_lse=False, validate=True):
    """The union of the SWA and SA masks in one softmax (training-free SA+SWA: no gate to learn).

    Query i reads key j when j <= i and (i - j < window or |slot(i) - slot(j)|_n < window / 2). SWA's
    band and SA's band minus the SWA window are computed apart and merged by log-sum-exp, so no key
    counts twice and nothing n x n is built. ``perm``, ``generator``, ``lengths`` and ``inv`` are as for
    ``stochastic_attention``. ``return_lse`` also returns the union's log-sum-exp (B, Hq, n), for sinks.
    """
    union = variants.SA_SWA_UNION
    out = union(q, k, v, AttentionSpec(union.name, window=window), perm, lengths, inv, validate=validate,
                scale=scale, generator=generator, return_lse=return_lse)
    return out if return_lse else out[0]


def moba_attention(q, k, v, block_size, top_k, *, scale=None, backend="auto"):
    """Mixture of Block Attention: own block (causal) plus the top_k - 1 best strictly-past blocks.

    ``backend``: ``auto`` (FlexAttention on CUDA, the gather kernel elsewhere), ``flex``, ``banded`` (the
    O(n*c) gather kernel) or ``dense`` (the n x n mask of the selection)."""
    moba = variants.MOBA
    return moba(q, k, v, AttentionSpec(moba.name, block_size=block_size, top_k=top_k, backend=backend),
                scale=scale)[0]
