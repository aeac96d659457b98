"""The radix control: a deterministic pattern at SA's budget that reaches every earlier token in the fewest layers
that budget allows. Query i reads itself and the earlier keys at the offsets a·p_k (1 <= a < b_k, p_k the product of
the bases below k): the digits of a mixed-radix number with bases b_0 >= b_1 >= ... Any distance below the bases'
product is a sum of at most K such offsets, one per nonzero digit, so K layers carry every key of the row to every
later query; the lowest digit's offsets 1 .. b_0 - 1 are its local band. Power-of-two offsets (PowerAttention,
arXiv 2503.03588) are the case b_k = 2, and a base-b number with K digits reads (b - 1)·K keys.

Its budget is SA's: the row's other keys, the sum of (b_k - 1), at most 2⌈w/2⌉ - 2 (SA's band's others). Within it
``radix_bases`` takes the fewest digits K whose bases reach the row's n valid tokens, and for that K the fewest keys
(growing the smallest base first keeps the product largest for its sum). Where no K within the budget reaches n,
it takes the pattern that reaches furthest (every base 2: distances below 2^budget), and ``analyze reach`` says how
much of the row that is: a finding about the budget, not a failure of the kernel.

A model has a depth: where those digits are more than its layers (``depth``: n = 512 at w = 16 needs 5), the bases are
chosen for the depth instead: of every set of bases within the budget (fewer digits than the row needs among them),
the one whose offsets reach the most (query, key) pairs of the causal row in ``depth`` layers (``reached``: exact, a
sumset of Python-int bitsets), ties to fewer keys. Where the fewest digits fit the depth they are kept, so a model
that covers its row (n = 128 or 256, L = 4) runs the pattern it always did.

The kernel reads each query's offsets as shifted views of k and v: O(n·K·d), nothing n x n, no gather.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F

from ._checks import check_positive
from .band_common import softmax_dtype
from .masks import sa_band_others


@functools.lru_cache(maxsize=4096)
def radix_bases(n: int, window: int, depth: int | None = None) -> tuple[int, ...]:
    """The bases (largest first) for a row of n valid tokens at window w: the fewest digits whose product reaches n
    with at most SA's 2⌈w/2⌉ - 2 other keys, and of those the fewest keys; every base 2 (the furthest reach) where
    none does. () for a row of one token. ``depth`` (the model's layers; None: as many as the digits): where those
    bases need more, the ones that reach the most within ``depth`` (``tuned_bases``)."""
    fewest = _fewest_digits(n, window)
    if depth is None or (math.prod(fewest) >= n and len(fewest) <= check_positive("depth", depth)):
        return fewest
    return tuned_bases(n, window, check_positive("depth", depth))


def _fewest_digits(n: int, window: int) -> tuple[int, ...]:
    if window < 3:
        raise ValueError(f"the radix control needs a window >= 3 (it reads 2*ceil(w/2) - 2 keys), got {window}.")
    budget = sa_band_others(window)
    if n <= 1:
        return ()
    if budget >= n - 1:  # one digit holds the whole row: causal attention
        return (n,)
    for digits in range(1, budget + 1):
        bases = _balanced(n, digits, budget)
        if math.prod(bases) >= n:
            return bases
    return (2,) * budget


def _balanced(n: int, digits: int, budget: int) -> tuple[int, ...]:
    """``digits`` bases grown smallest first (which keeps the product largest for its sum) until they reach n or
    spend the budget, largest first."""
    bases = [2] * digits
    while math.prod(bases) < n and sum(bases) - digits < budget:
        bases[bases.index(min(bases))] += 1
    return tuple(sorted(bases, reverse=True))


def offsets_of(bases: tuple[int, ...], n: int) -> tuple[int, ...]:
    """The offsets below n that ``bases`` (lowest digit first) give, ascending: a * p_k, 1 <= a < b_k."""
    out, place = [], 1
    for base in bases:
        out += [a * place for a in range(1, base) if a * place < n]
        place *= base
    return tuple(sorted(out))


def reached(offsets, n: int, depth: int) -> int:
    """The distances d < n that a query reaches within ``depth`` layers, as a Python-int bitset (bit d): the sums of at
    most ``depth`` offsets, 0 included."""
    row, seen = (1 << n) - 1, 1
    for _ in range(depth):
        grown = seen
        for o in offsets:
            grown |= seen << o
        grown &= row
        if grown == seen:
            break
        seen = grown
    return seen


def reached_pairs(offsets, n: int, depth: int) -> int:
    """The (query, key) pairs j <= i of a causal row of n that ``depth`` layers connect: the row holds n - d pairs d
    apart, for each distance d ``reached``."""
    bits = reached(offsets, n, depth)
    seen = np.unpackbits(np.frombuffer(bits.to_bytes((n + 7) // 8, "little"), np.uint8), bitorder="little")[:n]
    return int(seen.astype(np.int64) @ (n - np.arange(n, dtype=np.int64)))


#: the most other keys whose every partition into bases ``tuned_bases`` tries (p(1) + ... + p(24) ~ 7300 sets, the
#: windows up to 26); above it, the balanced bases of each digit count at the full budget
EXHAUSTIVE_BUDGET = 24


def _candidates(n: int, budget: int):
    """Bases, largest first, within ``budget`` other keys, whose top digit's place is below n (a digit past it adds no
    offset): every partition up to ``EXHAUSTIVE_BUDGET``, else the balanced ones of each digit count."""
    if budget > EXHAUSTIVE_BUDGET:
        for digits in range(1, max(2, n.bit_length()) + 1):
            yield _balanced(n, digits, budget)
        return

    def grow(prefix: list, largest: int, left: int, place: int):
        if prefix:
            yield tuple(prefix)
        if place >= n:
            return
        for base in range(min(largest, left + 1), 1, -1):
            yield from grow(prefix + [base], base, left - (base - 1), place * base)

    yield from grow([], budget + 1, budget, 1)


@functools.lru_cache(maxsize=4096)
def tuned_bases(n: int, window: int, depth: int) -> tuple[int, ...]:
    """The bases (largest first, at most SA's 2⌈w/2⌉ - 2 other keys) whose offsets reach the most pairs of a row of n
    in ``depth`` layers (``reached_pairs``), ties to fewer keys, then fewer digits, then the fewest-digits bases and
    the larger bases first. Exhaustive over every partition of the budget up to ``EXHAUSTIVE_BUDGET``."""
    budget = sa_band_others(window)
    fewest = _fewest_digits(n, window)
    if n <= 1 or budget >= n - 1:
        return fewest
    best = None
    for bases in dict.fromkeys([fewest, *_candidates(n, budget)]):
        offsets = offsets_of(bases, n)
        key = (-reached_pairs(offsets, n, depth), len(offsets), len(bases), bases != fewest, tuple(-b for b in bases))
        if best is None or key < best[0]:
            best = (key, bases)
    return best[1]


@functools.lru_cache(maxsize=4096)
def radix_offsets(n: int, window: int, depth: int | None = None) -> tuple[int, ...]:
    """The offsets i - j > 0 a query reads (below n), ascending."""
    return offsets_of(radix_bases(n, window, depth), n)


def radix_layers(n: int, window: int, depth: int | None = None) -> int | None:
    """The layers in which every earlier token of a row of n reaches every later query (its digits), or None where
    the bases do not reach n."""
    bases = radix_bases(n, window, depth)
    return len(bases) if math.prod(bases) >= n else None


def gap_table(n: int, window: int, lengths: torch.Tensor | None = None, device=None, depth: int | None = None
              ) -> torch.Tensor:
    """(1 or B, n) bool: [b, g] when a query of row b reads the key g tokens back (g = 0: itself), its offsets at the
    model's ``depth``; a host read of ``lengths`` (inference's padding), as the strided control's."""
    rows = [n] if lengths is None else [int(x) for x in lengths.view(-1).tolist()]
    table = torch.zeros(len(rows), max(n, 1), dtype=torch.bool)
    for b, length in enumerate(rows):
        table[b, 0] = True
        table[b, list(radix_offsets(max(length, 1), window, depth))] = True
    return table.to(device)


def radix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, *, scale: float,
                    lengths: torch.Tensor | None = None, return_lse: bool = False, depth: int | None = None):
    """The radix control's output for q (B, Hq, n, d), k, v (B, Hkv, n, d): one softmax over each query's own key and
    its offsets' keys, read as shifted views (a row of its own length reads its own offsets). With ``return_lse``,
    also each query's log-sum-exp (B, Hq, n), so sinks and unions merge with it. Every query reads at least itself,
    so no row is empty."""
    B, Hq, n, d = q.shape
    Hkv = k.shape[1]
    host = gap_table(n, window, lengths, depth=depth)  # (1 or B, n), on the host: the offsets are read there, once
    used = [0] + host[:, 1:].any(0).nonzero().add(1).view(-1).tolist()
    table = host.to(q.device)
    top = used[-1]
    kp, vp = (F.pad(t, (0, 0, top, 0)) for t in (k, v))  # row top + i holds token i; rows before it are zeros
    keys = torch.stack([kp[:, :, top - g:top - g + n] for g in used], dim=3)  # (B, Hkv, n, U, d): key i - g
    values = torch.stack([vp[:, :, top - g:top - g + n] for g in used], dim=3)
    qg = q.reshape(B, Hkv, Hq // Hkv, n, d)
    acc = softmax_dtype(q.dtype)  # fp32 scores for half inputs
    scores = torch.einsum("bhgnd,bhnud->bhgnu", qg.to(acc), keys.to(acc)) * scale
    gaps = torch.tensor(used, device=q.device)
    ok = (torch.arange(n, device=q.device).view(n, 1) >= gaps.view(1, -1))  # (n, U): the key exists
    ok = ok.view(1, n, len(used)) & table[:, gaps].view(table.shape[0], 1, len(used))  # (1 or B, n, U)
    scores = scores.masked_fill(~ok.view(ok.shape[0], 1, 1, n, len(used)), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1)).to(v.dtype)
    out = torch.einsum("bhgnu,bhnud->bhgnd", probs, values).reshape(B, Hq, n, d)
    return (out, lse.reshape(B, Hq, n)) if return_lse else out


def radix_mask(window: int, n: int, lengths: torch.Tensor | None = None, depth: int | None = None):
    """The radix control: j <= i and i - j is 0 or one of the row's digit offsets (``radix_offsets`` for
    each row's valid length, n without ``lengths``, at the model's ``depth``)."""
    table = gap_table(n, window, lengths, depth=depth)

    def mask(b, h, q_idx, kv_idx):
        gap = q_idx - kv_idx
        rows = table.to(gap.device)
        row = b if rows.shape[0] > 1 else torch.zeros_like(b)
        return (gap >= 0) & rows[row, gap.clamp(min=0)]

    return mask
