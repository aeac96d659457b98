"""Permutations for Stochastic Attention.

A permutation is a gather index, as in the paper's ``Q[sigma]``: slot ``s`` holds token ``perm[s]``,
so ``slot(perm[s]) = s``. It has shape (n,) (shared by the batch) or (B, n) (one per row), and one
permutation serves every head of a layer.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

#: what the reorders have moved while ``counting_moves`` is on (None: off); a host-side tally of shapes, no sync
_MOVED: list[dict | None] = [None]


@contextlib.contextmanager
def counting_moves() -> Iterator[dict]:
    """``with counting_moves() as moved: ...``: then ``moved["data"]`` is the bytes that every token reorder
    (forward and backward) read and wrote inside the block (each copy reads and writes its tensor once),
    ``moved["index"]`` the bytes of the indices they read and ``moved["copies"]`` their number. For ``bench
    profile``; eager only (a compiled graph's reorders are not counted)."""
    before, _MOVED[0] = _MOVED[0], {"data": 0, "index": 0, "copies": 0}
    try:
        yield _MOVED[0]
    finally:
        _MOVED[0] = before


def _count(out: torch.Tensor, index_rows: int) -> None:
    tally = _MOVED[0]
    if tally is not None and not torch.compiler.is_compiling():
        tally["data"] += 2 * out.numel() * out.element_size()
        tally["index"] += 8 * index_rows
        tally["copies"] += 1


def _count_grad(out: torch.Tensor, index_rows: int) -> None:
    """Count the backward copy of a reorder whose backward autograd writes (``index_select``'s index_add)."""
    if _MOVED[0] is not None and out.requires_grad and not torch.compiler.is_compiling():
        out.register_hook(lambda g: _count(g, index_rows))

def sample_permutation(
    n: int,
    *,
    batch: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw a uniform permutation of ``range(n)``: shape (n,), or (batch, n) with one per row.

    Seed it with ``generator`` to reproduce a run; the draw happens on the generator's device and the
    result moves to ``device``. With ``lengths`` (B,) for a right-padded batch, row b permutes only its
    first lengths[b] tokens, which fill its first lengths[b] slots; the padding keeps its place.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}.")
    gen_device = generator.device if generator is not None else torch.device("cpu")
    if lengths is not None:
        batch = lengths.shape[0]
    if batch is None:
        perm = torch.randperm(n, generator=generator, device=gen_device)
    else:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}.")
        # float64 keys make ties (which would bias the draw) practically impossible.
        keys = torch.rand(batch, n, generator=generator, device=gen_device, dtype=torch.float64)
        if lengths is not None:  # padding sorts after every valid token, in its own order
            slots = torch.arange(n, device=gen_device, dtype=torch.float64)
            keys = torch.where(slots < lengths.to(gen_device).view(-1, 1), keys, 2.0 + slots)
        perm = keys.argsort(dim=-1)
    return perm.to(device) if device is not None else perm


def prefix_permutations(lengths: list[int], n: int, generators: list[torch.Generator],
                        device: torch.device | str | None = None) -> torch.Tensor:
    """(B, n) gather index for a right-padded batch drawn row by row: row b permutes its first lengths[b]
    tokens with ``generators[b]`` and keeps its padding in place. Unlike ``sample_permutation(lengths=)``
    a row's draw depends only on its own generator, so it does not change with the rest of the batch."""
    table = torch.arange(n).repeat(len(lengths), 1)
    for b, (length, gen) in enumerate(zip(lengths, generators)):
        table[b, :length] = torch.randperm(length, generator=gen)
    return table.to(device) if device is not None else table


def invert_permutation(perm: torch.Tensor) -> torch.Tensor:
    """``slot`` index of every token: ``inv[perm[s]] = s`` along the last dim."""
    src = torch.arange(perm.shape[-1], device=perm.device).expand_as(perm)
    return torch.empty_like(perm).scatter_(-1, perm, src)


def gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Reorder (B, H, n, d) along n by a (n,) or (B, n) gather index."""
    if index.dim() == 1:
        out = x.index_select(2, index)
    else:
        out = torch.take_along_dim(x, index[:, None, :, None], dim=2)
    rows = out.shape[0] * out.shape[1] * out.shape[2]
    _count(out, rows if index.dim() == 2 else index.numel())
    _count_grad(out, rows if index.dim() == 2 else index.numel())
    return out


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, H, m, d) reordered along its tokens by ``index`` (1 or B, m'): each (batch, head) row copied whole, one
    ``index_select`` over the flattened rows (on a CPU about ten times faster than ``gather``, which reads an index
    per element)."""
    B, H, m, d = x.shape
    if torch.compiler.is_compiling():  # Inductor writes its own gather (and its flex templates want 4-D buffers)
        return torch.take_along_dim(x, index.expand(B, -1)[:, None, :, None], dim=2)
    if x.is_cuda and index.shape[0] == 1:  # one index for the batch: CUDA's index_select along the tokens copied
        out = x.index_select(2, index[0])  # 4 tensors in 1.7 ms where the flattened rows took 10.2 ms for 8 (H200)
        _count(out, index.shape[1])
        return out
    index = index.expand(B, -1)
    flat = index.view(B, 1, -1) + m * torch.arange(B * H, device=x.device).view(B, H, 1)
    out = x.reshape(B * H * m, d).index_select(0, flat.view(-1)).view(B, H, -1, d)
    _count(out, flat.numel())
    return out


class _PermuteTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, index, inverse, valid):
        ctx.save_for_backward(inverse)
        ctx.valid = valid
        return _rows(x, index)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        out = _rows(grad, inverse)
        if ctx.valid is not None and ctx.valid < out.shape[2]:
            out[:, :, ctx.valid:] = 0
        return out, None, None, None


def permute_tokens(x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor,
                   valid: int | None = None) -> torch.Tensor:
    """x (B, H, m, d) reordered along its tokens by ``index`` ((m',) or (B, m')), whose backward is the same row
    copy by ``inverse`` rather than the scatter-add of a gather's or ``index_select``'s backward. ``index`` is a
    permutation of x's rows, or one followed by spare entries that repeat a row (bucketed SA's last bucket, filled
    up); ``inverse`` gives each row of x its place in the output, and then the rows of the gradient from ``valid``
    on (the spare ones, whose outputs no one reads) are zero."""
    index = index if index.dim() == 2 else index.unsqueeze(0)
    inverse = inverse if inverse.dim() == 2 else inverse.unsqueeze(0)
    return _PermuteTokens.apply(x, index, inverse, valid)


def layer_generator(seed: int, layer: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for one layer, derived from the run seed, so layers draw independent streams."""
    gen = torch.Generator(device=device)
    gen.manual_seed((int(seed) * 1_000_003 + int(layer) * 7919) % (2**63 - 1))
    return gen
