"""The strided control with a local band (the Sparse Transformer's strided pattern): query i reads the h keys just
before it and itself, and every earlier key j with (i - j) mod s = 0. Alone, the strided pattern splits a row into s
groups that never exchange information; the band joins them, so an offset a*s + r (r < s) is reached by one strided
hop and ceil(r / h) band hops.

Its budget is SA's kernel cost: the row's last query computes at most 2*ceil(w/2) - 1 keys, as many as SA's band of
slots holds. Within that, (h, s) reach every earlier token in the fewest layers (s = (L - 1) * h + 1 reaches any
offset in L layers), and of those, the pair that attends the fewest keys. Deterministic and evenly spread, it attends
somewhat more keys than SA (whose band is half masked by causality on average): ``keys_attended`` says how many.
"""
from __future__ import annotations

import functools

import torch

from .banded import banded_attention
from .dense import merge_partials
from .masks import sa_band_others
from .strided import by_length, strided_attention


@functools.lru_cache(maxsize=4096)
def local_stride(n: int, window: int) -> tuple[int, int, int]:
    """(h, s, layers) for a row of n valid tokens at window w: the band's other keys h, the stride s, and the layers
    in which every earlier token is reached. The last query computes h + 1 + floor((n - 1) / s) keys, at most SA's
    2*ceil(w/2) - 1."""
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


def local_strides(lengths: torch.Tensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, s) of each row, as tensors (what the masks read); a host read of ``lengths`` (inference's padding)."""
    pairs = [local_stride(int(n), window)[:2] for n in lengths.view(-1).tolist()]
    h, s = zip(*pairs) if pairs else ((), ())
    return (torch.tensor(h, dtype=torch.long, device=lengths.device),
            torch.tensor(s, dtype=torch.long, device=lengths.device))


def _one_length(q, k, v, window: int, scale: float, extra_band: int):
    """(output, lse) of rows that are all valid. ``extra_band``: a wider band to leave the strided keys out of (a
    union with SWA's window w: the band's keys are then SWA's)."""
    n = q.shape[2]
    h, s, _ = local_stride(n, window)
    band = max(h + 1, extra_band)
    if band >= n:
        return banded_attention(q, k, v, before=n - 1, after=0, scale=scale, return_lse=True)
    y_near, lse_near = banded_attention(q, k, v, before=band - 1, after=0, scale=scale, return_lse=True)
    y_far, lse_far = strided_attention(q, k, v, window, scale=scale, skip_recent=band, validate=False,
                                       stride_of=lambda length: s)
    return merge_partials(y_near, lse_near, y_far, lse_far)


def local_strided_attention(q, k, v, window: int, *, scale: float, lengths: torch.Tensor | None = None,
                            validate: bool = True, extra_band: int = 0):
    """(output, log-sum-exp) of the strided pattern with its local band: the band by the banded kernel, the strided
    keys beyond it by the grouped one, merged by log-sum-exp (no key counted twice). ``lengths`` (B,): each row its
    own (h, s), rows of one length run together; outputs at padding tokens are 0."""
    return by_length(q, k, v, lengths, validate,
                     lambda q_, k_, v_: _one_length(q_, k_, v_, window, scale, extra_band))
