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

    data:
      repeats: {length: 16, gap: 160}     # configs/study/pretrain.yaml, preset repeats
      repeats: {length: 8, gap: 80, count: 3, alphabet: 256}   # preset copy: three copies per block, 256 token ids
      repeats: {length: 8, gap: 32, copies: 3, count: 2, alphabet: 256}  # preset copy-multi: three sources each

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

    @property
    def span(self) -> int:
        """Tokens from a segment's first occurrence to the end of its last copy."""
        return self.copies * self.gap + self.length

    def starts(self, p: int) -> list[int]:
        """Where a segment first placed at p lies: p, then each copy ``gap`` after the one before (the last scored)."""
        return [p + j * self.gap for j in range(self.copies + 1)]

    def high(self, vocab: int) -> int:
        return vocab if self.alphabet is None else self.low + self.alphabet

    def check(self, seq_len: int, vocab: int) -> None:
        if self.length < 2 or self.gap < self.length:
            raise ValueError(f"data repeats needs length >= 2 and gap >= length, got length={self.length}, "
                             f"gap={self.gap}.")
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
            p = self._place(g, size, taken)
            segment = torch.randint(self.low, self.high(vocab), (self.length,), generator=g, dtype=block.dtype)
            *sources, q = self.starts(p)  # q: the scored copy
            for start in (*sources, q):
                out[start:start + self.length] = segment
                taken[start:start + self.length] = True
            for start in sources:  # the first occurrence and each copy before the last: not scored
                planted[max(start - 1, 0):start + self.length - 1] = True
            mask[q:q + self.length - 1] = True
            planted[q - 1] = True
        return out, mask & ~planted, planted

    def _place(self, g: torch.Generator, size: int, taken: torch.Tensor) -> int:
        """A start p whose spans touch no span planted before (a segment's first draw is always free)."""
        for _ in range(_TRIES):
            p = int(torch.randint(0, size - self.span + 1, (1,), generator=g))
            if not any(taken[s:s + self.length].any() for s in self.starts(p)):
                return p
        raise ValueError(f"data repeats could not place {self.count} segments of {self.length} tokens {self.gap} "
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
