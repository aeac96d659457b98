"""The public attention functions. Shapes: q (B, Hq, n, d); k, v (B, Hkv, n, d); out like q.

Every function is causal in original token positions. ``backend`` picks the implementation:
``"auto"`` (FlexAttention on CUDA, the banded kernel elsewhere), ``"banded"``, ``"flex"`` or ``"dense"``
(n x n; short sequences and checks only).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import masks
from ._checks import (BACKENDS, check_lengths, check_padded_perm, check_perm, check_positive, check_qkv,
                      default_scale)
from ._finite import checking_finite, guard_nonfinite, kv_finite
from .band_common import fused_forward_applies
from .band_inplace import Band, multi_band_attention
from .banded import banded_attention
from .dense import dense_masked_attention, merge_partials
from .flex import MIN_HEAD_DIM
from .moba import moba_kernel, moba_selection, picks_per_head
from .permutation import invert_permutation, permute_tokens, sample_permutation



def _backend(backend: str, q: torch.Tensor) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
    if backend == "auto":
        return "flex" if q.is_cuda and q.shape[-1] >= MIN_HEAD_DIM else "banded"
    return backend


def permutation_args(perm, inv, generator, lengths, B: int, n: int, device, validate: bool = True):
    """SA's checked (perm, inv, lengths): a drawn permutation when ``perm`` is None (its inverse then unknown;
    with ``lengths``, one per row that keeps the padding in place). A given ``perm`` must keep every row's
    padding out of its first lengths[b] slots (``check_padded_perm``). ``validate=False`` checks types and
    shapes only, for a caller whose perm and lengths are valid by construction (no host sync)."""
    lengths = check_lengths(lengths, B, n, device, values=validate)
    if perm is None:
        return sample_permutation(n, generator=generator, device=device, lengths=lengths), None, lengths
    perm = check_perm(perm, B, n, device, values=validate)
    if validate:
        check_padded_perm(perm, lengths)
    return perm, inv, lengths


def checked_inputs(variant, draws, lengths, batch: int, n: int, device):
    """(draws, lengths) checked once at a model's public boundary (values included: host syncs), so that its
    layers can run the kernels with ``validate=False``. ``draws`` holds one draw per layer (None for a layer
    that draws nothing), each checked by the variant's ``check_draw``; ``draws`` itself may be None."""
    lengths = check_lengths(lengths, batch, n, device)
    if draws is not None:
        draws = [d if d is None or variant.check_draw is None else variant.check_draw(d, batch, n, device, lengths)
                 for d in draws]
    return draws, lengths


def full_attention(q, k, v, *, scale=None):
    """Causal attention over all previous tokens (PyTorch SDPA)."""
    _, Hq, Hkv, _, d = check_qkv(q, k, v)
    scale = default_scale(d, scale)
    return guard_nonfinite(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scale, enable_gqa=Hq != Hkv), q, k, v)


def sliding_window_attention(q, k, v, window, *, scale=None, backend="auto"):
    """Query i reads keys j with 0 <= i - j <= window - 1."""
    B, Hq, Hkv, n, d = check_qkv(q, k, v)
    window = check_positive("window", window)
    scale = default_scale(d, scale)
    backend = _backend(backend, q)
    return guard_nonfinite(lambda q, k, v: _swa(q, k, v, window, scale, backend), q, k, v)


def _swa(q, k, v, window: int, scale: float, backend: str):
    n = q.shape[2]
    if backend == "dense" or (backend == "banded" and n < 2 * window):
        return dense_masked_attention(q, k, v, masks.dense(masks.sliding_window(window), n, device=q.device), scale=scale)
    if backend == "flex":
        from .flex import swa_flex

        return swa_flex(q, k, v, window, scale=scale)
    return banded_attention(q, k, v, before=window - 1, after=0, scale=scale)


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

    With the debug mode on (``check_finite``), a NaN or inf key or value reaches only the rows that see it.

    ``validate=False`` skips the value checks of ``perm`` and ``lengths`` (their host syncs): for a caller that
    draws them valid by construction, as the model does in every layer of every step.

    ``inv`` is ``perm``'s inverse (``invert_permutation(perm)``), for callers that precompute sigma and
    sigma^-1 together, as the paper does; it is not checked against ``perm``.
    """
    B, Hq, Hkv, n, d = check_qkv(q, k, v)
    window = check_positive("window", window)
    perm, inv, lengths = permutation_args(perm, inv, generator, lengths, B, n, q.device, validate)
    scale = default_scale(d, scale)
    backend = _backend(backend, q)
    return guard_nonfinite(lambda q, k, v: _sa(q, k, v, window, perm, inv, lengths, scale, backend), q, k, v)


def _sa(q, k, v, window: int, perm, inv, lengths, scale: float, backend: str):
    """``stochastic_attention`` on checked arguments."""
    B, _, n, _ = q.shape
    if backend == "flex" and lengths is not None:
        backend = "banded"  # the flex block mask is built per (n, band); ragged bands would rebuild it per call
    pos = perm if perm.dim() == 2 else perm.unsqueeze(0)
    if backend == "dense" or (backend == "banded" and n < 2 * window):
        slot = invert_permutation(pos).expand(B, n)
        mask = masks.stochastic(slot, window, lengths)
        return dense_masked_attention(q, k, v, masks.dense(mask, n, batch=B, device=q.device), scale=scale)
    if backend == "flex":
        from .flex import sa_flex_slots

        inv = invert_permutation(pos) if inv is None else inv.view(-1, n)
        # row copies both ways: a gather's backward would be an atomic index_add (4.9 ms of SA's 15.1 on an H200)
        qs, ks, vs = (permute_tokens(t, pos, inv) for t in (q, k, v))
        ys = sa_flex_slots(qs, ks, vs, pos, window, scale=scale)
        return permute_tokens(ys, inv, pos)
    half = masks.sa_half_width(window)
    return banded_attention(q, k, v, before=half, after=half, perm=pos, lengths=lengths, scale=scale, inv=inv)


def sa_swa_attention(q, k, v, window, perm=None, *, generator=None, scale=None, backend="auto", lengths=None,
                     inv=None, validate=True):
    """Both paths of gated SA+SWA: returns (y_sa, y_swa), each exactly what ``stochastic_attention`` and
    ``sliding_window_attention`` return for these arguments (``perm``, ``generator``, ``lengths``, ``inv``
    and ``backend`` as there; SA's path reads one permutation, drawn here when ``perm`` is None).

    The paths share q, k and v, so on the banded backend with gradients (training on CPU) both bands
    run in one pass (``multi_band_attention``): one gather of queries and one of keys and values in
    slot order feed both softmaxes, and no key window is copied. On CPU, forward and backward cost
    1.96x one SWA call at n=8192, w=256 (two bands are twice the matmuls of one; SWA and SA alone run
    the same in-place kernel with one band). Every other case
    (FlexAttention on CUDA, ``dense``, rows shorter than two windows, forward-only inference, where
    SDPA's fused kernel serves each band) calls the two paths' own functions.
    """
    B, Hq, Hkv, n, d = check_qkv(q, k, v)
    window = check_positive("window", window)
    perm, inv, lengths = permutation_args(perm, inv, generator, lengths, B, n, q.device, validate)
    scale = default_scale(d, scale)
    backend = _backend(backend, q)

    def both(q, k, v):
        if backend != "banded" or n < 2 * window or fused_forward_applies(q, k, v):
            y_sa = _sa(q, k, v, window, perm, inv, lengths, scale, backend)
            return y_sa, _swa(q, k, v, window, scale, backend)
        half = masks.sa_half_width(window)
        sa = Band(half, half, perm.view(-1, n), inv, lengths)
        y_sa, y_swa = multi_band_attention(q, k, v, [sa, Band(window - 1, 0)], scale=scale)
        return y_sa, y_swa

    return guard_nonfinite(both, q, k, v)


def sa_swa_union_attention(q, k, v, window, perm=None, *, generator=None, scale=None, lengths=None, inv=None,
                           return_lse=False, validate=True):
    """The union of the SWA and SA masks in one softmax (training-free SA+SWA: no gate to learn).

    Query i reads key j when j <= i and (i - j < window or |slot(i) - slot(j)|_n < window / 2). SWA's
    band and SA's band minus the SWA window are computed apart and merged by log-sum-exp, so no key
    counts twice and nothing n x n is built. ``perm``, ``generator``, ``lengths`` and ``inv`` are as for
    ``stochastic_attention``. ``return_lse`` also returns the union's log-sum-exp (B, Hq, n), for sinks.
    """
    B, Hq, Hkv, n, d = check_qkv(q, k, v)
    window = check_positive("window", window)
    perm, inv, lengths = permutation_args(perm, inv, generator, lengths, B, n, q.device, validate)
    scale = default_scale(d, scale)
    run = lambda q, k, v: _sa_swa_union(q, k, v, window, perm, inv, lengths, scale, return_lse)  # noqa: E731
    return guard_nonfinite(run, q, k, v)


def _sa_swa_union(q, k, v, window: int, perm, inv, lengths, scale: float, return_lse: bool = False):
    """``sa_swa_union_attention`` on checked arguments (``perm`` given), with no guard of its own: for
    callers (sinks) that guard the whole computation."""
    B, _, n, _ = q.shape
    pos = perm if perm.dim() == 2 else perm.unsqueeze(0)
    if n < 2 * window:
        slot = invert_permutation(pos).expand(B, n)
        mask = masks.union(masks.stochastic(slot, window, lengths), masks.sliding_window(window))
        return dense_masked_attention(q, k, v, masks.dense(mask, n, batch=B, device=q.device), scale=scale,
                                      return_lse=return_lse)
    half = masks.sa_half_width(window)
    y_swa, lse_swa = banded_attention(q, k, v, before=window - 1, after=0, scale=scale, return_lse=True)
    y_sa, lse_sa = banded_attention(q, k, v, before=half, after=half, perm=pos, lengths=lengths, scale=scale,
                                    skip_recent=window, return_lse=True, inv=inv)
    y, lse = merge_partials(y_swa, lse_swa, y_sa, lse_sa)  # half inputs merge in fp32, float64 in float64
    return (y, lse) if return_lse else y


def moba_attention(q, k, v, block_size, top_k, *, scale=None, backend="auto"):
    """Mixture of Block Attention: own block (causal) plus the top_k - 1 best strictly-past blocks.

    ``backend``: ``auto`` (FlexAttention on CUDA, the gather kernel elsewhere), ``flex``, ``banded`` (the
    O(n*c) gather kernel) or ``dense`` (the n x n mask of the selection)."""
    _, _, _, n, d = check_qkv(q, k, v)
    block_size = check_positive("block_size", block_size)
    top_k = check_positive("top_k", top_k)
    scale = default_scale(d, scale)
    backend = _backend(backend, q)
    finite = kv_finite(k, v) if checking_finite() else True
    # With non-finite keys the guard's runs must read the same blocks: the gate of the inputs as given
    # (a NaN gate never selects).
    chosen = None if finite else moba_selection(q, k, block_size, top_k)
    if backend == "dense":
        run = lambda q, k, v: _moba_dense(q, k, v, block_size, top_k, scale, chosen)  # noqa: E731
    else:
        kernel = "flex" if backend == "flex" else "gather"
        run = lambda q, k, v: moba_kernel(q, k, v, block_size=block_size, top_k=top_k, scale=scale,  # noqa: E731
                                          selection=chosen, backend=kernel)
    return run(q, k, v) if finite else guard_nonfinite(run, q, k, v, finite=False)


def _moba_dense(q, k, v, block_size: int, top_k: int, scale: float, selection=None):
    """MoBA through the dense n x n mask of its selection (short sequences, and a check of the other paths)."""
    n = q.shape[2]
    selection = selection if selection is not None else moba_selection(q, k, block_size, top_k)
    picks = picks_per_head(selection, q)
    mask = masks.dense(masks.moba_picks(picks, block_size), n, batch=q.shape[0], heads=q.shape[1], device=q.device)
    return dense_masked_attention(q, k, v, mask, scale=scale)
