"""The attention output gate (Appendix B) and its dual-path form for SA+SWA (Eq. 6-7)."""
from __future__ import annotations

import torch
from torch import nn


class GatedPaths(nn.Module):
    """Y = sum_p sigmoid(W_p Y_p) * Y_p, one d x d gate per path.

    With one path this is the single-path gate sigmoid(W_g Y) * Y; with paths ("sa", "swa") it is the
    paper's gated SA+SWA combination. The two sigmoid gates are independent (they need not sum to 1).
    Inputs are (..., d) with heads already merged.
    """

    def __init__(self, dim: int, paths: tuple[str, ...] = ("attn",)):
        super().__init__()
        if not paths:
            raise ValueError("paths must name at least one attention path.")
        self.paths = tuple(paths)
        self.gates = nn.ModuleDict({p: nn.Linear(dim, dim, bias=False) for p in self.paths})

    def forward(self, *outputs: torch.Tensor) -> torch.Tensor:
        if len(outputs) != len(self.paths):
            raise ValueError(f"GatedPaths expects {len(self.paths)} outputs {self.paths}, got {len(outputs)}.")
        total = None
        for name, y in zip(self.paths, outputs):
            gated = torch.sigmoid(self.gates[name](y)) * y
            total = gated if total is None else total + gated
        return total
