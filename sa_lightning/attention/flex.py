"""The FlexAttention path (CUDA; CPU forward only, as FlexAttention has no CPU backward).

The block-sparsity pattern of a band depends only on (n, band, block size), so it is built once and
cached. Each call only swaps the ``mask_mod``, which captures the per-layer positions: no
``create_block_mask`` runs per step.

Lengths are bucketed: a call at length n runs at ``bucket(n)`` (n itself at a power of two, otherwise the
next of 2^k and 1.5 * 2^k, at least one block), with the padded keys masked out and the padded queries
dropped. The compiled kernel is specialized on its shapes, so a prefill or evaluation over documents of
many lengths compiles once per bucket (two per doubling) instead of once per length; every mask_mod takes
the true length as a tensor, never as a constant of the graph.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from . import masks

BLOCK = 128
#: FlexAttention's Triton kernel needs a head dim of at least this on CUDA (torch 2.11's Inductor: "NYI: embedding
#: dimension of the query, key, and value must be at least 16"); ``auto`` picks the banded kernels below it
MIN_HEAD_DIM = 16


def _flex():
    from torch.nn.attention import flex_attention as fa

    return fa


#: dynamo's recompile limit while FlexAttention is compiled. Every variant's mask, every length and every
#: q/k/v layout adds a graph to the one ``flex_attention`` frame; past dynamo's default of 8 it falls back to
#: the unfused path, which holds the whole n x n score matrix (a 32k prefill of Qwen3-8B's shapes asked for
#: 32 GiB on an H100, docs/benchmarks.md).
RECOMPILE_LIMIT = 64


@functools.lru_cache(maxsize=None)
def _compiled():
    config = torch._dynamo.config
    if hasattr(config, "recompile_limit"):  # torch >= 2.6 (cache_size_limit before); raised, never lowered
        config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(_flex().flex_attention, dynamic=False)


def bucket(n: int, block: int = BLOCK) -> int:
    """The length a call at length n runs at: n at a power of two, else the next of 2^k and 1.5 * 2^k (so at
    most a third of the rows are padding), and never below one block."""
    if n <= block:
        return block
    top = 1 << (n - 1).bit_length()  # the power of two at or above n
    return top * 3 // 4 if top * 3 // 4 >= n else top


@functools.lru_cache(maxsize=64)
def _length(n: int, device: str) -> torch.Tensor:
    """n as a 0-d tensor for a mask_mod to capture (a Python int would be a constant of the compiled graph)."""
    return torch.tensor(n, device=device)


def _pad(t: torch.Tensor, size: int, value=0) -> torch.Tensor:
    """``t`` padded along its sequence dimension (dim 2, or the last of a (B, n) table) to ``size``."""
    dim = 2 if t.dim() == 4 else t.dim() - 1
    extra = size - t.shape[dim]
    if not extra:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [0, extra]
    return F.pad(t, pad, value=value)


def _band_blocks(n: int, before: int, after: int, circular: bool, block: int, device: str, size: int | None = None):
    """(1, 1, Qb, KVb) bool: which (query block, key block) pairs hold any in-band slot pair, over ``size``
    positions (n by default; padded slots past n may add blocks, never drop one). A circular band wraps at n."""
    size = n if size is None else size
    nb = -(-size // block)
    starts = torch.arange(nb, device=device) * block
    ends = torch.clamp(starts + block, max=size) - 1
    # Slot offsets delta = s - t of a block pair span [qs - ke, qe - ks]; the band is [-after, before].
    lo = starts.view(-1, 1) - ends.view(1, -1)
    hi = ends.view(-1, 1) - starts.view(1, -1)
    hit = (lo <= before) & (hi >= -after)
    if circular:  # the same band shifted by +-n
        hit |= (lo - n <= before) & (hi - n >= -after)
        hit |= (lo + n <= before) & (hi + n >= -after)
    return hit.view(1, 1, nb, nb)


def _kv_blocks(hit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_num_blocks, kv_indices) of a (..., query blocks, key blocks) bool table of visited tiles: how many
    each query block visits, and their indices first (stable, so in key order)."""
    num = hit.sum(-1, dtype=torch.int32)
    order = torch.argsort((~hit).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num, order


@functools.lru_cache(maxsize=64)
def _band_tables(n: int, before: int, after: int, circular: bool, block: int, device: str, size: int):
    """(kv_num_blocks, kv_indices) of a band over ``size`` positions: which key blocks each query block visits."""
    hit = _band_blocks(n, before, after, circular, block, device, size)
    return _kv_blocks(hit)


def band_block_mask(n: int, before: int, after: int, circular: bool, block: int = BLOCK, device: str = "cuda",
                    size: int | None = None, mask_mod=masks.causal):
    """The BlockMask of a band over ``size`` positions (n by default) with ``mask_mod``. Its block tables are
    built once per shape and cached; every visited block is partial, since the mask_mod may add a data-dependent
    test (SA's causality on original positions, the true length of a padded call). Inside a compiled graph the
    cache is skipped and the tables are traced: they depend on Python ints only, so they fold to constants."""
    size = n if size is None else size
    if torch.compiler.is_compiling():
        num, order = _band_tables.__wrapped__(n, before, after, circular, block, device, size)
    else:
        num, order = _band_tables(n, before, after, circular, block, device, size)
    return _flex().BlockMask.from_kv_blocks(num, order, BLOCK_SIZE=block, mask_mod=mask_mod,
                                            seq_lengths=(size, size))


def flex_attention(q, k, v, block_mask, *, scale: float, compiled: bool = True) -> torch.Tensor:
    """FlexAttention, compiled on its own when called eagerly; inside a compiled graph (a model compiled with
    ``model.compile: true``) the graph's compiler takes it as one of its ops."""
    fn = _compiled() if compiled and not torch.compiler.is_compiling() else _flex().flex_attention
    if torch.compiler.is_compiling() and not q.is_cuda:
        # Inductor's CPU template reads a strided q, k or v (a head-split projection's view) wrongly inside a
        # compiled model (torch 2.13: SWA off by 0.14 against the banded kernel); a copy is Inductor's to fuse
        q, k, v = (t.contiguous() for t in (q, k, v))
    enable_gqa = q.shape[1] != k.shape[1]
    return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _padded(fn, q, k, v, *tables):
    """``fn(q, k, v, *tables, size)`` at the bucketed length, cut back to n rows. Padded keys are never read:
    they lie after every real query (the causal variants) or carry a position past every real one (SA)."""
    n = q.shape[2]
    size = bucket(n)
    q, k, v = (_pad(t, size) for t in (q, k, v))
    tables = tuple(_pad(t, size, value) for t, value in tables)
    return fn(q, k, v, *tables, size)[:, :, :n]


def swa_flex(q, k, v, window: int, *, scale: float, compiled: bool = True):
    def run(q, k, v, size):
        bm = band_block_mask(size, window - 1, 0, False, BLOCK, str(q.device), mask_mod=masks.sliding_window(window))
        return flex_attention(q, k, v, bm, scale=scale, compiled=compiled)

    return _padded(run, q, k, v)


def sa_flex_slots(qs, ks, vs, pos: torch.Tensor, window: int, *, scale: float, compiled: bool = True):
    """SA on slot-ordered q/k/v; ``pos`` (B or 1, n) is each slot's original position."""
    n = qs.shape[2]
    half = masks.sa_half_width(window)

    def run(qs, ks, vs, size):
        if torch.compiler.is_compiling():
            # inside a compiled model, specialized on n anyway: the drawn table as it came in (a padded copy would
            # be a buffer the graph computes, which Inductor's CPU template cannot capture, torch 2.13)
            table, length = pos, n
        else:  # the standalone kernel compiles once per bucket: every captured shape is the bucket's
            table, length = _pad(pos, size), _length(n, str(qs.device))
        mod = masks.stochastic_in_slots(table, window, length)
        if 2 * half + 1 >= n:  # the band covers every slot
            bm = band_block_mask(n, size, size, False, BLOCK, str(qs.device), size, mask_mod=mod)
        else:
            bm = band_block_mask(n, half, half, True, BLOCK, str(qs.device), size, mask_mod=mod)
        return flex_attention(qs, ks, vs, bm, scale=scale, compiled=compiled)

    return _padded(run, qs, ks, vs)  # the mask reads no slot past n


def moba_block_mask(picks: torch.Tensor, block_size: int, block: int = BLOCK):
    """The BlockMask of MoBA for ``picks`` (B, H, n, P), -1 = no pick: a key tile is visited by a query tile
    when it overlaps the own block of one of the tile's queries (causally) or a block one of them picked.
    Built on the device from the picks, with no host sync; every visited tile is partial."""
    B, H, n, _ = picks.shape
    nt, nblk = -(-n // block), -(-n // block_size)
    dev = picks.device
    tile_of_query = (torch.arange(n, device=dev) // block).view(1, 1, n, 1).expand_as(picks)
    chosen = torch.zeros(B, H, nt, nblk + 1, dtype=torch.int32, device=dev)  # column 0 takes the -1s
    flat = (tile_of_query * (nblk + 1) + picks + 1).reshape(B, H, -1)
    chosen.view(B, H, -1).scatter_(-1, flat, torch.ones_like(flat, dtype=torch.int32))
    chosen = chosen[..., 1:]
    # key tile t covers keys [t*block, (t+1)*block - 1], i.e. blocks lo(t)..hi(t): any chosen among them?
    starts = torch.arange(nt, device=dev) * block
    ends = torch.clamp(starts + block, max=n) - 1
    lo, hi = starts // block_size, ends // block_size
    cum = F.pad(chosen.cumsum(-1), (1, 0))
    picked = (cum[..., hi + 1] - cum[..., lo]) > 0  # (B, H, nt, nt)
    # own blocks: query tile [qs, qe] reads keys from block(qs)'s start up to qe
    own = (starts.view(1, -1) <= ends.view(-1, 1)) & (ends.view(1, -1) >= (starts // block_size * block_size).view(-1, 1))
    hit = picked | own
    num, order = _kv_blocks(hit)
    return _flex().BlockMask.from_kv_blocks(num, order, BLOCK_SIZE=block, mask_mod=masks.moba_picks(picks, block_size),
                                            seq_lengths=(n, n))


def moba_flex(q, k, v, picks: torch.Tensor, block_size: int, *, scale: float, compiled: bool = True):
    """MoBA on FlexAttention: ``picks`` (B, Hq, n, P) are each query head's selected past blocks (-1: none)."""
    def run(q, k, v, picks, size):
        return flex_attention(q, k, v, moba_block_mask(picks, block_size), scale=scale, compiled=compiled)

    return _padded(run, q, k, v, (picks, -1))


def keys_block_mask(seeds: torch.Tensor, keys_window: int, n: int, size: int, lengths: torch.Tensor | None = None,
                    window: int = 0, block: int = BLOCK):
    """The BlockMask of the random-keys control over ``size`` >= n positions (``window`` > 0: its union with SWA's
    last ``window`` keys): the hash of ``masks.random_keys`` (p from ``keys_window`` and each row's length, n or
    ``lengths``) as the mask function, evaluated tile by tile, over every causal tile. Independent keys at p about
    w/n leave almost no causal tile empty, so visiting them all skips nothing worth skipping, and nothing n x n
    is stored (the block tables are cached per size, as a band's are)."""
    mod = masks.random_keys(seeds, keys_window, n, lengths)
    if window:
        mod = masks.union(mod, masks.sliding_window(window))
    return band_block_mask(size, size, 0, False, block, str(seeds.device), mask_mod=mod)


def keys_flex(q, k, v, seeds: torch.Tensor, keys_window: int, *, scale: float, lengths: torch.Tensor | None = None,
              window: int = 0, compiled: bool = True):
    """The random-keys control (``window`` > 0: its union with SWA's window) on FlexAttention, exact over the
    hash's mask. ``seeds`` (1 or B,); padded queries past the bucket's n are dropped."""
    n = q.shape[2]

    def run(q, k, v, size):
        bm = keys_block_mask(seeds, keys_window, n, size, lengths, window)
        return flex_attention(q, k, v, bm, scale=scale, compiled=compiled)

    return _padded(run, q, k, v)
