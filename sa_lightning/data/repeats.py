"""A language-model mix with long-range information in it: random-token segments planted in text and repeated.

Each block of text gets ``count`` segments of ``length`` random tokens, each at a random position p and again at
p + ``gap``, no two of the 2 * ``count`` spans overlapping. The text around them is left alone. Once the model has
seen a segment's first token in its copy, the rest of the copy is predictable only by looking ``gap`` tokens back:
a window shorter than that cannot, full attention can (an induction head). Scored apart (``repeat``, a mask over
the targets), the NLL on the copies measures reach inside ordinary language modelling; the NLL on the text measures
everything else.

    data:
      repeats: {length: 16, gap: 160}     # configs/study/pretrain.yaml, preset repeats
      repeats: {length: 8, gap: 80, count: 3, alphabet: 256}   # preset copy: three copies per block, 256 token ids

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
    """``count`` random segments of ``length`` tokens per block, each planted twice, ``gap`` tokens apart; their
    tokens are drawn uniformly from ``[low, low + alphabet)`` (default: up to the vocabulary; ``low`` keeps clear
    of the special tokens). A smaller alphabet leaves the copy's information the same (the copy is still the only
    way to predict it) and lowers the guess's cost, ln(alphabet) nats."""

    length: int = 16
    gap: int = 160
    low: int = 16
    count: int = 1
    alphabet: int | None = None

    def high(self, vocab: int) -> int:
        return vocab if self.alphabet is None else self.low + self.alphabet

    def check(self, seq_len: int, vocab: int) -> None:
        if self.length < 2 or self.gap < self.length:
            raise ValueError(f"data repeats needs length >= 2 and gap >= length, got length={self.length}, "
                             f"gap={self.gap}.")
        if self.gap + self.length > seq_len + 1:
            raise ValueError(f"data repeats with gap {self.gap} and length {self.length} do not fit a block of "
                             f"seq_len + 1 = {seq_len + 1} tokens; shorten them or raise seq_len.")
        if self.count < 1 or 4 * self.count * self.length > seq_len + 1:
            raise ValueError(f"data repeats plants 2 x count = {2 * self.count} spans of {self.length} tokens; a "
                             f"block of seq_len + 1 = {seq_len + 1} holds at most a quarter of its tokens so, got "
                             f"count={self.count}: lower count or length.")
        if not 0 <= self.low < self.high(vocab) - 1 or self.high(vocab) > vocab:
            raise ValueError(f"data repeats draws tokens from [{self.low}, {self.high(vocab)}), which must hold two "
                             f"ids and lie inside the vocabulary of {vocab}.")

    def plant(self, block: torch.Tensor, seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``block`` (n + 1,) with each segment planted twice, the (n,) mask of the targets that the copies make
        predictable (target t predicts token t + 1, so the copy at q..q+length-1 gives targets q..q+length-2), and
        the (n,) mask of the other targets the planting made: the first occurrence's tokens (random, unpredictable)
        and the copy's first token. Neither mask is text."""
        g = torch.Generator().manual_seed(seed)
        size = block.numel()
        out = block.clone()
        taken = torch.zeros(size, dtype=torch.bool)
        mask = torch.zeros(size - 1, dtype=torch.bool)
        planted = torch.zeros(size - 1, dtype=torch.bool)
        for _ in range(self.count):
            p = self._place(g, size, taken)
            segment = torch.randint(self.low, self.high(vocab), (self.length,), generator=g, dtype=block.dtype)
            q = p + self.gap
            out[p:p + self.length] = segment
            out[q:q + self.length] = segment
            taken[p:p + self.length] = taken[q:q + self.length] = True
            mask[q:q + self.length - 1] = True
            planted[max(p - 1, 0):p + self.length - 1] = True
            planted[q - 1] = True
        return out, mask & ~planted, planted

    def _place(self, g: torch.Generator, size: int, taken: torch.Tensor) -> int:
        """A start p whose two spans touch no span planted before (a segment's first draw is always free)."""
        for _ in range(_TRIES):
            p = int(torch.randint(0, size - self.gap - self.length + 1, (1,), generator=g))
            if not (taken[p:p + self.length].any() or taken[p + self.gap:p + self.gap + self.length].any()):
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
