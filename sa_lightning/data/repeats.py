"""A language-model mix with long-range information in it: random-token segments planted in text and repeated.

Each block of text gets one segment of ``length`` random tokens at a random position p, and the same segment
again at p + ``gap``. The text around them is left alone. Once the model has seen the segment's first token in
the copy, the rest of the copy is predictable only by looking ``gap`` tokens back: a window shorter than that
cannot, full attention can (an induction head). Scored apart (``repeat``, a mask over the targets), the NLL on the
copies measures reach inside ordinary language modelling; the NLL on the text measures everything else.

    data:
      repeats: {length: 16, gap: 160}     # configs/study/pretrain.yaml, preset repeats

Training blocks draw a fresh segment each epoch (from the epoch and the block's index: a resumed run plants the
same); validation blocks one fixed segment each, so every model is scored on the same copies. The text's NLL leaves
out every target the planting made (``planted``), the copies' are ``repeat``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset


@dataclass(frozen=True)
class RepeatMix:
    """One random segment of ``length`` tokens per block, planted twice, ``gap`` tokens apart; its tokens are drawn
    uniformly from ``[low, vocab)`` (``low`` keeps clear of the special tokens)."""

    length: int = 16
    gap: int = 160
    low: int = 16

    def check(self, seq_len: int, vocab: int) -> None:
        if self.length < 2 or self.gap < self.length:
            raise ValueError(f"data repeats needs length >= 2 and gap >= length, got length={self.length}, "
                             f"gap={self.gap}.")
        if self.gap + self.length > seq_len + 1:
            raise ValueError(f"data repeats with gap {self.gap} and length {self.length} do not fit a block of "
                             f"seq_len + 1 = {seq_len + 1} tokens; shorten them or raise seq_len.")
        if not 0 <= self.low < vocab - 1:
            raise ValueError(f"data repeats draws tokens from [{self.low}, {vocab}): too few.")

    def plant(self, block: torch.Tensor, seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``block`` (n + 1,) with the segment planted twice, the (n,) mask of the targets that the copy makes
        predictable (target t predicts token t + 1, so the copy at q..q+length-1 gives targets q..q+length-2), and
        the (n,) mask of the other targets the planting made: the first occurrence's tokens (random, unpredictable)
        and the copy's first token. Neither mask is text."""
        g = torch.Generator().manual_seed(seed)
        size = block.numel()
        p = int(torch.randint(0, size - self.gap - self.length + 1, (1,), generator=g))
        segment = torch.randint(self.low, vocab, (self.length,), generator=g, dtype=block.dtype)
        out = block.clone()
        q = p + self.gap
        out[p:p + self.length] = segment
        out[q:q + self.length] = segment
        mask = torch.zeros(size - 1, dtype=torch.bool)
        mask[q:q + self.length - 1] = True
        planted = torch.zeros(size - 1, dtype=torch.bool)
        planted[max(p - 1, 0):p + self.length - 1] = True
        planted[q - 1] = True
        return out, mask, planted


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
