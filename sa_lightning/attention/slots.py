"""A layer in slot order: the permutation applied once to the layer's input rows instead of to q, k, v and the output.

A variant that permutes (SA, bucketed SA) reads its keys in σ's slot order. Reordering q, k and v to slots and the
output back costs four copies of a (B, H, n, d) tensor forward and four backward. Everything else in an attention
layer is token-wise (the norms, the projections, the output gate) except RoPE, which reads each token's original
position. So a model can gather the layer's input rows (B, n, C) once, project them in slot order with RoPE at the
gathered positions, run the variant's kernel on slot-ordered q, k, v (``Variant.in_slots``), gate and project in
slot order, and put the output rows back once: two copies of (B, n, C) forward and two backward, half the bytes
where q's heads fill C (fewer still with grouped-query keys and values). ``SlotOrder`` says where each token goes;
``to_slots`` and ``from_slots`` move rows, each with a row copy (not an atomic scatter) as its backward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .permutation import permute_tokens


@dataclass(frozen=True)
class SlotOrder:
    """Where each token sits in a layer run in slot order; every table is (1 or B, ·) on the device.

    ``pos`` (·, m): the original position of the token in each slot, ``n`` for a spare slot (m > n: bucketed SA
    fills its last bucket up; the spare slots come last, and no real query reads them). ``index``: ``pos`` with
    the spares clamped to a real row (what the gather copies). ``inverse`` (·, n): each token's slot."""

    pos: torch.Tensor
    index: torch.Tensor
    inverse: torch.Tensor

    @property
    def n(self) -> int:
        return self.inverse.shape[-1]

    @property
    def slots(self) -> int:
        return self.pos.shape[-1]


def to_slots(x: torch.Tensor, order: SlotOrder) -> torch.Tensor:
    """(B, n, C) rows in token order -> (B, m, C) in slot order (a spare slot repeats a real row)."""
    return permute_tokens(x.unsqueeze(1), order.index, order.inverse).squeeze(1)


def from_slots(y: torch.Tensor, order: SlotOrder) -> torch.Tensor:
    """(B, m, C) rows in slot order -> (B, n, C) in token order; the spare slots' rows get no gradient."""
    return permute_tokens(y.unsqueeze(1), order.inverse, order.index, order.n).squeeze(1)


def slot_positions(cos: torch.Tensor, sin: torch.Tensor, order: SlotOrder) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's tables (1 or B, 1, n, hd) at the slots' original positions: (1 or B, 1, m, hd)."""
    B = max(cos.shape[0], order.index.shape[0])
    index = order.index.expand(B, -1)[:, None, :, None].expand(B, 1, -1, cos.shape[-1])
    return (torch.gather(cos.expand(B, -1, -1, -1), 2, index), torch.gather(sin.expand(B, -1, -1, -1), 2, index))

