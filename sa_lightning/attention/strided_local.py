"""The strided control with a local band (the Sparse Transformer's strided pattern): query i reads the h keys just
before it and itself, and every earlier key j with (i - j) mod s = 0. Alone, the strided pattern splits a row into s
groups that never exchange information; the band joins them, so an offset a*s + r (r < s) is reached by one strided
hop and ceil(r / h) band hops.

Its budget is SA's kernel cost: the row's last query computes at most 2*ceil(w/2) - 1 keys, as many as SA's band of
slots holds. Within that, (h, s) reach every earlier token in the fewest layers (s = (L - 1) * h + 1 reaches any
offset in L layers), and of those, the pair that attends the fewest keys. Deterministic and evenly spread, it attends
somewhat more keys than SA (whose band is half masked by causality on average): ``keys_attended`` says how many.

A model has a depth: where that fewest-layers pair needs more layers than the model has (``depth``: n = 256 at w = 16
needs 6, a model of 4 reaches 61% past SWA's field with it), the pair is chosen for the depth instead: the one within
the budget that reaches the most (query, key) pairs of the causal row in ``depth`` layers (``reached``, exact in
closed form), ties to fewer keys computed. Where the fewest-layers pair reaches within the depth it is kept, so a
model that covers its row (n = 128, L = 4) runs the pattern it always did.
"""
from __future__ import annotations

import functools

import torch

from ._checks import check_positive
from .banded import banded_attention
from .dense import merge_partials
from .masks import sa_band_others
from .strided import by_length, strided_attention


@functools.lru_cache(maxsize=4096)
def local_stride(n: int, window: int, depth: int | None = None) -> tuple[int, int, int]:
    """(h, s, layers) for a row of n valid tokens at window w: the band's other keys h, the stride s, and the layers
    in which every earlier token is reached. The last query computes h + 1 + floor((n - 1) / s) keys, at most SA's
    2*ceil(w/2) - 1. ``depth`` (the model's layers; None: as many as the pattern needs): where the fewest-layers
    pair needs more, the pair that reaches the most within ``depth`` (``tuned_stride``)."""
    fewest = _fewest_layers(n, window)
    if depth is None or fewest[2] <= check_positive("depth", depth):
        return fewest
    return tuned_stride(n, window, depth)


def _fewest_layers(n: int, window: int) -> tuple[int, int, int]:
    if window < 3:
        raise ValueError(f"the strided control needs a window >= 3 (it reads 2*ceil(w/2) - 2 keys), got {window}.")
    budget = sa_band_others(window) + 1
    if budget >= n:  # the band holds the whole row: causal attention, one layer
        return max(n - 1, 0), max(n, 1), 1
    for layers in range(2, n + 1):
        best = None
        for h in range(1, budget - 1):
            s = (layers - 1) * h + 1
            if h + 1 + (n - 1) // s > budget:
                continue
            attended = sum(min(i, h) + 1 + i // s for i in range(n))
            if best is None or attended < best[0]:
                best = (attended, h, s)
        if best is not None:
            return best[1], best[2], layers
    raise AssertionError("unreachable: h = 1 with s >= n fits any budget >= 2")


def reached(n: int, h: int, s: int, depth: int) -> torch.Tensor:
    """(n,) bool: [d] when a query reaches the key d tokens back within ``depth`` layers of the pattern (h, s): d is
    a sum of at most ``depth`` of its offsets (1 .. h, and the multiples of s below n; 0 included). One strided hop
    carries any multiple of s, so d is reached iff d <= depth * h, or d >= s and d mod s <= (depth - 1) * h."""
    d = torch.arange(n)
    return (d <= depth * h) | ((d >= s) & (d % s <= (depth - 1) * h))


def reached_pairs(n: int, h: int, s: int, depth: int) -> int:
    """The (query, key) pairs j <= i of a causal row of n that ``depth`` layers of (h, s) connect: the row holds n - d
    pairs d apart."""
    return int(((n - torch.arange(n)) * reached(n, h, s, depth)).sum())


def _series(lo: torch.Tensor, hi: torch.Tensor, n: int) -> torch.Tensor:
    """The sum of n - d over lo <= d <= hi (0 where hi < lo), elementwise."""
    count = (hi - lo + 1).clamp(min=0)
    return count * n - count * (lo + hi) // 2


@functools.lru_cache(maxsize=4096)
def tuned_stride(n: int, window: int, depth: int) -> tuple[int, int, int]:
    """(h, s, layers): of every pair within SA's budget (1 <= h, h < s <= n), the one whose ``depth`` layers reach the
    most pairs of the row (``reached_pairs``, in closed form over each stride's blocks), ties to fewer keys computed
    (h + 1 + ceil(n / s)), then fewer attended, then the smaller s; ``layers`` are its own to the whole row."""
    budget = sa_band_others(window) + 1
    if budget >= n:
        return _fewest_layers(n, window)
    best = None
    for h in range(1, budget):
        s = torch.arange(h + 1, n + 1)
        s = s[h + 1 + (n - 1) // s <= budget]  # the last query computes no more than SA's band
        if not len(s):
            continue
        near = min(depth * h, n - 1)
        pairs = _series(torch.zeros_like(s), torch.full_like(s, near), n)
        width = torch.clamp(s - 1, max=(depth - 1) * h)  # residues reached: blocks never overlap
        for c in range(1, (n - 1) // int(s[0]) + 1):  # block c: c*s .. c*s + width, past the band's reach
            k = int(torch.searchsorted(s, (n - 1) // c, right=True))  # the strides whose block c lies in the row
            pairs[:k] += _series(torch.clamp(c * s[:k], min=near + 1), torch.clamp(c * s[:k] + width[:k], max=n - 1),
                                 n)
        computed = torch.clamp(h + 1 + -(-n // s), max=n)
        q = (n - 1) // s  # sum over i < n of floor(i / s), in closed form
        attended = (h + 1) * n - h * (h + 1) // 2 + s * q * (q - 1) // 2 + q * (n - q * s)
        pick = torch.ones_like(s, dtype=torch.bool)
        for value in (-pairs, computed, attended, s):  # lexicographic: the first of each that ties on the ones before
            pick &= value == value[pick].min()
        i = int(pick.nonzero()[0])
        key = (-int(pairs[i]), int(computed[i]), int(attended[i]), int(s[i]), h)
        if best is None or key < best:
            best = key
    h, s = best[4], best[3]
    return h, s, _layers(n, h, s)


def _layers(n: int, h: int, s: int) -> int:
    """The fewest layers in which (h, s) reaches every earlier token: the most any distance d needs, ceil(d / h) by
    the band alone or one strided hop and ceil((d mod s) / h) band hops."""
    d = torch.arange(1, n)
    if not len(d):
        return 1
    need = -(-d // h)
    need = torch.where(d >= s, torch.minimum(need, 1 + -(-(d % s) // h)), need)
    return int(need.max())


def local_strides(lengths: torch.Tensor, window: int, depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, s) of each row, as tensors (what the masks read); a host read of ``lengths`` (inference's padding)."""
    pairs = [local_stride(int(n), window, depth)[:2] for n in lengths.view(-1).tolist()]
    h, s = zip(*pairs) if pairs else ((), ())
    return (torch.tensor(h, dtype=torch.long, device=lengths.device),
            torch.tensor(s, dtype=torch.long, device=lengths.device))


def _one_length(q, k, v, window: int, scale: float, extra_band: int, depth: int | None):
    """(output, lse) of rows that are all valid. ``extra_band``: a wider band to leave the strided keys out of (a
    union with SWA's window w: the band's keys are then SWA's)."""
    n = q.shape[2]
    h, s, _ = local_stride(n, window, depth)
    band = max(h + 1, extra_band)
    if band >= n:
        return banded_attention(q, k, v, before=n - 1, after=0, scale=scale, return_lse=True)
    y_near, lse_near = banded_attention(q, k, v, before=band - 1, after=0, scale=scale, return_lse=True)
    y_far, lse_far = strided_attention(q, k, v, window, scale=scale, skip_recent=band, validate=False,
                                       stride_of=lambda length: s)
    return merge_partials(y_near, lse_near, y_far, lse_far)


def local_strided_attention(q, k, v, window: int, *, scale: float, lengths: torch.Tensor | None = None,
                            validate: bool = True, extra_band: int = 0, depth: int | None = None):
    """(output, log-sum-exp) of the strided pattern with its local band: the band by the banded kernel, the strided
    keys beyond it by the grouped one, merged by log-sum-exp (no key counted twice). ``lengths`` (B,): each row its
    own (h, s) (at the model's ``depth``), rows of one length run together; outputs at padding tokens are 0."""
    return by_length(q, k, v, lengths, validate,
                     lambda q_, k_, v_: _one_length(q_, k_, v_, window, scale, extra_band, depth))


def strided_local_mask(window: int, n: int, lengths: torch.Tensor | None = None, depth: int | None = None):
    """The strided control with its local band: j <= i and (i - j <= h or (i - j) mod s = 0), (h, s) from
    ``local_stride`` for each row's valid length (n without ``lengths``) at the model's ``depth``."""
    if lengths is None:
        h, s, _ = local_stride(n, window, depth)
    else:
        h, s = local_strides(lengths, window, depth)

    def mask(b, h_, q_idx, kv_idx):
        band, step = (h, s) if lengths is None else (h[b], s[b])
        gap = q_idx - kv_idx
        return (gap >= 0) & ((gap <= band) | (gap % step == 0))

    return mask
