"""A language-model mix with long-range information in it: random-token segments planted in text and repeated.

Each block of text gets ``count`` segments of ``length`` random tokens, each at a random position p and again at
p + ``gap`` (with ``copies`` = k, at p + gap, p + 2 gap, ..., p + k gap), no two spans overlapping. The text around
them is left alone. Once the model has seen a segment's first token in its copy, the rest of the copy is
predictable only by looking ``gap`` tokens back: a window shorter than that cannot, full attention can (an
induction head). Scored apart (``repeat``, a mask over the targets), the NLL on the copies measures reach inside
ordinary language modelling; the NLL on the text measures everything else.

With ``copies`` = k > 1 only the last copy is scored: each of its tokens has k earlier sources, all at least ``gap``
back, so a sparse query that sees each earlier token with probability p per layer reaches one of them with
probability 1 - (1 - p)^k instead of p. The copies between are planted (neither scored nor text).

With ``gap_max``, each segment draws its own gap, uniformly from ``gap`` to ``gap_max``: no fixed offset then
finds a copy's source, only its content does. Segments of ``length`` 2 are then associative recall inside text:
each is a key and its value, planted once and asked again later, the value scored (``study pretrain``'s preset
``recall-pilot``; full attention did not learn it in 2000 steps: docs/results.md, Table 12b).

    data:
      repeats: {length: 16, gap: 160}     # configs/study/pretrain.yaml, preset repeats
      repeats: {length: 8, gap: 80, count: 3, alphabet: 256}   # preset copy: three copies per block, 256 token ids
      repeats: {length: 8, gap: 32, copies: 3, count: 2, alphabet: 256}  # preset copy-multi: three sources each
      repeats: {length: 2, gap: 32, gap_max: 96, count: 8, alphabet: 256}  # preset recall-pilot: 8 key-value pairs

Training blocks draw fresh segments each epoch (from the epoch and the block's index: a resumed run plants the
same); validation blocks fixed ones, so every model is scored on the same copies. The text's NLL leaves
out every target the planting made (``planted``), the copies' are ``repeat``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

_TRIES = 1000  # placements tried per segment before a block is declared too crowded


@dataclass(frozen=True)
class RepeatMix:
    """``count`` random segments of ``length`` tokens per block, each planted ``copies`` + 1 times, ``gap`` tokens
    apart; their tokens are drawn uniformly from ``[low, low + alphabet)`` (default: up to the vocabulary; ``low``
    keeps clear of the special tokens). A smaller alphabet leaves the copy's information the same (the copy is
    still the only way to predict it) and lowers the guess's cost, ln(alphabet) nats."""

    length: int = 16
    gap: int = 160
    low: int = 16
    count: int = 1
    alphabet: int | None = None
    copies: int = 1
    gap_max: int | None = None

    @property
    def span(self) -> int:
        """The most tokens from a segment's first occurrence to the end of its last copy."""
        return self.copies * (self.gap_max or self.gap) + self.length

    def starts(self, p: int, gap: int | None = None) -> list[int]:
        """Where a segment first placed at p lies: p, then each copy ``gap`` after the one before (the last scored)."""
        return [p + j * (gap or self.gap) for j in range(self.copies + 1)]

    def high(self, vocab: int) -> int:
        return vocab if self.alphabet is None else self.low + self.alphabet

    def check(self, seq_len: int, vocab: int) -> None:
        if self.length < 2 or self.gap < self.length:
            raise ValueError(f"data repeats needs length >= 2 and gap >= length, got length={self.length}, "
                             f"gap={self.gap}.")
        if self.gap_max is not None and self.gap_max < self.gap:
            raise ValueError(f"data repeats draws each gap from gap to gap_max, so gap_max={self.gap_max} cannot be "
                             f"below gap={self.gap}.")
        if self.copies < 1:
            raise ValueError(f"data repeats needs copies >= 1, got copies={self.copies}.")
        if self.span > seq_len + 1:
            raise ValueError(f"data repeats with gap {self.gap}, length {self.length} and {self.copies} copies do not "
                             f"fit a block of seq_len + 1 = {seq_len + 1} tokens; shorten them or raise seq_len.")
        spans = (self.copies + 1) * self.count
        if self.count < 1 or 2 * spans * self.length > seq_len + 1:
            raise ValueError(f"data repeats plants (copies + 1) x count = {spans} spans of {self.length} tokens; a "
                             f"block of seq_len + 1 = {seq_len + 1} holds at most half its tokens so, got "
                             f"count={self.count}: lower count, copies or length.")
        if not 0 <= self.low < self.high(vocab) - 1 or self.high(vocab) > vocab:
            raise ValueError(f"data repeats draws tokens from [{self.low}, {self.high(vocab)}), which must hold two "
                             f"ids and lie inside the vocabulary of {vocab}.")

    def plant(self, block: torch.Tensor, seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``block`` (n + 1,) with each segment planted ``copies`` + 1 times, the (n,) mask of the targets that the
        last copy makes predictable (target t predicts token t + 1, so the copy at q..q+length-1 gives targets
        q..q+length-2), and the (n,) mask of the other targets the planting made: the first occurrence's tokens
        (random, unpredictable), each copy's first token and the copies before the last. Neither mask is text."""
        g = torch.Generator().manual_seed(seed)
        size = block.numel()
        out = block.clone()
        taken = torch.zeros(size, dtype=torch.bool)
        mask = torch.zeros(size - 1, dtype=torch.bool)
        planted = torch.zeros(size - 1, dtype=torch.bool)
        for _ in range(self.count):
            gap = self.gap
            if self.gap_max is not None:  # its own gap (no draw without one: fixed-gap blocks plant as before)
                gap = int(torch.randint(self.gap, self.gap_max + 1, (1,), generator=g))
            p = self._place(g, size, taken, gap)
            segment = torch.randint(self.low, self.high(vocab), (self.length,), generator=g, dtype=block.dtype)
            *sources, q = self.starts(p, gap)  # q: the scored copy
            for start in (*sources, q):
                out[start:start + self.length] = segment
                taken[start:start + self.length] = True
            for start in sources:  # the first occurrence and each copy before the last: not scored
                planted[max(start - 1, 0):start + self.length - 1] = True
            mask[q:q + self.length - 1] = True
            planted[q - 1] = True
        return out, mask & ~planted, planted

    def _place(self, g: torch.Generator, size: int, taken: torch.Tensor, gap: int) -> int:
        """A start p whose spans, ``gap`` apart, touch no span planted before (a segment's first draw is always
        free)."""
        for _ in range(_TRIES):
            p = int(torch.randint(0, size - (self.copies * gap + self.length) + 1, (1,), generator=g))
            if not any(taken[s:s + self.length].any() for s in self.starts(p, gap)):
                return p
        raise ValueError(f"data repeats could not place {self.count} segments of {self.length} tokens {gap} "
                         f"apart in a block of {size} tokens after {_TRIES} tries; lower count or length.")


def text_targets(batch: dict) -> torch.Tensor:
    """The (B, n) targets of a labeled batch that are the text's own: neither a copy (``repeat``) nor another target
    the planting made (``planted``). Validation and ``study pretrain`` score the text on these."""
    return ~(batch["repeat"] | batch["planted"])


class RepeatedBlocks(Dataset):
    """``blocks`` with a ``RepeatMix`` planted in each, drawn from (``seed``, index). ``labeled`` (validation):
    items are ``{"tokens", "labels", "repeat", "planted"}``, the same segment for block i every time. Training
    indexes it through ``EpochOffsetSampler`` (index = epoch * len + block): each epoch plants fresh segments, the
    same ones on a resumed run and on any number of workers."""

    def __init__(self, blocks, mix: RepeatMix, vocab: int, seed: int, labeled: bool):
        self.blocks, self.mix, self.vocab, self.seed, self.labeled = blocks, mix, vocab, seed, labeled

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int):
        block = torch.as_tensor(self.blocks[index % len(self.blocks)])
        tokens, repeat, planted = self.mix.plant(block, self.seed * 1_000_003 + index, self.vocab)
        if self.labeled:
            return {"tokens": tokens, "labels": tokens[1:].clone(), "repeat": repeat, "planted": planted}
        return tokens
