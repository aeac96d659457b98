"""K models of one architecture as one: each member's parameters stacked along a leading member dimension
(``torch.func.stack_module_state``), the members' rows side by side in the batch.

Why not ``vmap(functional_call(...))`` over the whole model. It was tried on every trained variant (torch 2.13,
CPU): the attention kernels hold custom autograd functions and read values on the host (``.item()`` for the
banded SA kernels, data-dependent control flow for the random control's key table), which vmap refuses, and SDPA
(Full, SWA) has no batching rule on the CPU (a slow per-member fallback). So the members are **folded into the
batch** instead: member k's B rows are rows k·B .. (k+1)·B − 1 of one batch of K·B rows. Every per-token layer
(embedding, linears, RMSNorm) is swapped for its member-stacked form, which views those rows as (K, B·…) and
applies member k's weights to member k's rows (a batched matmul); everything between them, the attention kernels
included, is the model's own code, unchanged, on the K·B rows. Attention never mixes rows, and each row carries its
own member's draw (σ, hash seed) as a per-row draw, which every kernel already takes for padded batches; so no
number of one member ever reaches another, and its gradient is that of its own loss.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import stack_module_state

from .transformer import Transformer


class _Stacked(nn.Module):
    """A per-token layer with one weight per member (``weight``: (K, ...)), on inputs whose leading dimension is
    K·B rows, member-major."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())

    @property
    def members(self) -> int:
        return self.weight.shape[0]

    def by_member(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] % self.members:
            raise ValueError(f"a stacked layer of {self.members} members got {x.shape[0]} rows, not a multiple.")
        return x.reshape(self.members, -1, x.shape[-1])


class StackedLinear(_Stacked):
    """``nn.Linear`` without bias, member k's (out, in) weight on member k's rows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.bmm(self.by_member(x), self.weight.transpose(1, 2))
        return y.reshape(*x.shape[:-1], self.weight.shape[1])


class StackedRMSNorm(_Stacked):
    """``nn.RMSNorm``: each row normed as it is (the norm is row-wise), then scaled by its member's weight. Norming a
    reshaped view of x instead changes the last bit of x's gradient (measured: torch 2.13, CPU), which the members
    alone do not see."""

    def __init__(self, weight: torch.Tensor, eps: float | None):
        super().__init__(weight)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x, (x.shape[-1],), None, self.eps)
        return (self.by_member(y) * self.weight[:, None, :]).reshape(x.shape)


class StackedEmbedding(_Stacked):
    """Member k's rows look up member k's table: its ids offset by k·V into the K tables laid end to end."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        members, vocab, dim = self.weight.shape
        rows = idx.reshape(members, -1)
        offset = torch.arange(members, device=idx.device)[:, None] * vocab
        return F.embedding(rows + offset, self.weight.reshape(members * vocab, dim)).reshape(*idx.shape, dim)


def stack_members(nets: Sequence[Transformer]) -> Transformer:
    """One model holding ``nets``' parameters stacked (member k's are ``[k]`` of each), which runs K·B rows,
    member-major, through the model's own forward. The nets must share their architecture (their seeds may
    differ); each keeps its own parameters, untouched."""
    nets = list(nets)
    if not nets:
        raise ValueError("stack_members needs at least one model.")
    shapes = [{k: tuple(p.shape) for k, p in n.named_parameters()} for n in nets]
    if any(s != shapes[0] for s in shapes):
        raise ValueError("the members of an ensemble must share every parameter's name and shape.")
    params, _ = stack_module_state(nets)
    stacked = copy.deepcopy(nets[0])
    for name, module in list(stacked.named_modules()):
        if isinstance(module, nn.Linear) and module.bias is None:
            new = StackedLinear(params[f"{name}.weight"]) if f"{name}.weight" in params else None
        elif isinstance(module, nn.Embedding):
            new = StackedEmbedding(params[f"{name}.weight"])
        elif isinstance(module, nn.RMSNorm):
            new = StackedRMSNorm(params[f"{name}.weight"], module.eps)
        else:
            continue
        if new is not None:
            parent, _, leaf = name.rpartition(".")
            setattr(stacked.get_submodule(parent) if parent else stacked, leaf, new)
    stacked.lm_head = StackedLinear(params["embed.weight"])
    stacked.lm_head.weight = stacked.embed.weight  # tied, as in each member
    left = [k for k, p in stacked.named_parameters() if p.dim() == 0 or p.shape[0] != len(nets)
            or k not in params]
    if left or len(dict(stacked.named_parameters())) != len(params):
        raise ValueError(f"stack_members does not know how to stack {left or 'every parameter'}: the model holds a "
                         "layer that is not a bias-free Linear, an Embedding or an RMSNorm.")
    return stacked


def member_state(stacked: Transformer, k: int) -> dict[str, torch.Tensor]:
    """Member k's parameters, under the names of a single model (tied weights under both names)."""
    return {name: p[k] for name, p in stacked.named_parameters(remove_duplicate=False)}


def fold_draws(draws: Sequence[Sequence[torch.Tensor | None]], rows: int, draw_ndim: int) -> list:
    """Each layer's draw for the K·``rows`` rows of a stacked batch from each member's own draws (``draws[k]``: its
    layers', each shared by its batch or one per row): member k's draw on member k's rows."""
    layers = len(draws[0])
    folded = []
    for layer in range(layers):
        per = [d[layer] for d in draws]
        if per[0] is None:
            folded.append(None)
            continue
        per = [_rows(d, rows, draw_ndim) for d in per]
        folded.append(torch.cat(per, dim=0))
    return folded


def _rows(draw: torch.Tensor, rows: int, draw_ndim: int) -> torch.Tensor:
    """A member's draw as one per row: a shared one (a row's shape, or a batch of one) repeated ``rows`` times."""
    if draw.dim() == draw_ndim:
        return draw.expand(rows, *draw.shape)
    if draw.shape[0] == 1:
        return draw.expand(rows, *draw.shape[1:])
    if draw.shape[0] != rows:
        raise ValueError(f"a member's draw holds {draw.shape[0]} rows, not its batch's {rows}.")
    return draw
