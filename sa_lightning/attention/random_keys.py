"""The random-keys control: query i reads itself and each earlier key j < i independently with
probability p = (2 * ceil(w/2) - 2) / (n - 1), n the row's valid length. That is SA's exact probability that two
tokens share a band (each of the other n - 1 tokens lands in one of SA's 2 * ceil(w/2) - 2 neighbouring slots
with equal chance), so the control has SA's expected degree at every position, with independent edges instead
of a permutation's (BigBird's random keys, at SA's budget).

**The draw** is one seed per row (or one for the batch), (1 or B,) int64, as σ is SA's draw: every pair's
edge is a counter-based hash of (seed, i, j) against the row's threshold (``masks.pair_hash``, drawn per layer
and step because the seed is). So the pattern needs nothing n x n in memory: FlexAttention (CUDA's route)
evaluates the hash tile by tile inside its mask function, and the CPU kernels build the key table below from
the same hash, so every path reads the same draw. The table costs O(n^2) hash evaluations per layer (22 ms at
n = 2048 on one CPU thread, beside about 50 ms for the gather itself); the draw itself is O(B).

**The kernel** gathers each query's keys (its own, then the table's) and runs one softmax over them:
O(n * K * d), K about w, chunked over queries. It returns its log-sum-exp, so sinks and the union with SWA
merge with it; ``skip_recent`` leaves out the keys SWA's window already reads. Each kv head's keys are rows of
one matrix, so a query's keys come in one row gather, and each chunk of queries gathers only up to its own
last key (early queries read about p * i keys, not the table's width). Gathered keys are memory-bound, where a
masked n x n product reuses every key from cache, so the n x n path wins on short rows. Measured side by side on
the 2-core CPU (2026-11-26, docs/benchmarks.md): in inference (SmolLM2's 9 query and 3 kv heads, head dim 64)
the gather wins from about 3.5 times the keys a query reads (n = 256, w = 64, n = 3.3 K: n x n 7.6 ms against
10.9 gathered; n = 512, w = 128, n = 3.6 K: 27.1 against 16.8; n = 2048, w = 32: 802 against 52); with a backward
pass from about 12 (n = 256, w = 16: 152 against 373 gathered; n = 1024, w = 64: 1528 against 1365). So the
variants run the n x n path while its scores fit ``DENSE_ELEMENTS`` and n < ``INFERENCE_RATIO`` x K
(``TRAINING_RATIO`` when q needs a gradient) (:func:`dense_is_cheaper`), and the gather beyond. Without grouped
kv heads the gather fetches a key per query head, not per group, so the crossover moves out: the tiny models'
shapes (4 query and 4 kv heads, d = 32, batch 16, w = 32, one thread) ran n x n 16.9 ms against 35.8 gathered at
n = 192, 29.6 against 34.7 at 256, 54.5 against 42.5 at 320 and 115 against 68 at 512: about 6.5 K. Inference's
ratio is therefore 2 + 4.5 x (kv heads / query heads): 3.5 for SmolLM2's groups of three, 6.5 without groups
(the training ratio was measured with groups of three only). The rule is approximate: of the measured rows it
misroutes one, n = 128, w = 16 (gathered 2.5 ms against 1.6), and the ratios were measured on the CPU only. On CUDA ``auto`` takes FlexAttention instead (``flex.keys_flex``): a training step
of this gather keeps n * K * d per head for its backward, which ran out of an H200's 139 GiB at Table 2's shapes.
"""
from __future__ import annotations

import math

import torch

from .masks import SEED_LIMIT, pair_hash, random_thresholds, sa_band_others

#: gathered elements (queries x keys x head dim x kv heads x batch) per chunk of queries
_CHUNK_ELEMENTS = 1 << 24
#: hashed pairs (rows x queries x keys) per chunk of a key table's build
_TABLE_ELEMENTS = 1 << 18  # cache-sized: at 1 << 22 the same table took 14 times as long
#: up to this many scores (batch x query heads x n x n), the n x n masked path runs instead of the gather
DENSE_ELEMENTS = 1 << 26
#: without a backward pass, the gather runs once n reaches INFERENCE_RATIO + INFERENCE_RATIO_PER_KV x (kv heads /
#: query heads) times the keys a query reads: 3.5 with SmolLM2's groups of three, 6.5 without groups
INFERENCE_RATIO = 2.0
INFERENCE_RATIO_PER_KV = 4.5
#: with one (a training step)
TRAINING_RATIO = 12


def dense_is_cheaper(q: torch.Tensor, keys: int, kv_heads: int | None = None) -> bool:
    """Whether the n x n masked path is the faster exact route for q (B, Hq, n, d) whose queries each read about
    ``keys`` keys from ``kv_heads`` kv heads (None: as many as q's): while its scores fit and n is below
    (INFERENCE_RATIO + INFERENCE_RATIO_PER_KV x kv_heads / Hq) x keys, or TRAINING_RATIO x keys when q needs a
    gradient (the module's docstring has the measurements)."""
    B, Hq, n, _ = q.shape
    if B * Hq * n * n > DENSE_ELEMENTS:
        return False
    if torch.is_grad_enabled() and q.requires_grad:
        return n < TRAINING_RATIO * keys
    share = (Hq if kv_heads is None else kv_heads) / Hq
    return n < (INFERENCE_RATIO + INFERENCE_RATIO_PER_KV * share) * keys


def budget(window: int) -> int:
    """2 * ceil(w/2) - 2: the other keys SA's band offers a query (w >= 3: at least one)."""
    if window < 3:
        raise ValueError(f"the random-keys control needs a window >= 3 (it reads 2*ceil(w/2) - 2 keys at SA's "
                         f"rate), got {window}.")
    return sa_band_others(window)


def probability(length: int, window: int) -> float:
    """p for a row of ``length`` valid tokens: SA's connection probability, at most 1."""
    return min(1.0, budget(window) / (length - 1)) if length > 1 else 0.0


def draw_keys(spec, n: int, lengths, generator, device=None) -> torch.Tensor:
    """The variant's draw (``Variant.draw``): one seed (1,) for the batch from one ``generator`` (``lengths``
    None), (B,) with ``lengths`` (B,), or (B,) from a list of generators, row b's seed from generators[b] alone
    (the hash does not read n, so neither the batch nor its padding changes a row's keys)."""
    budget(spec.window)  # refuses a window below 3 before anything is drawn
    if isinstance(generator, (list, tuple)):
        seeds = torch.cat([torch.randint(0, SEED_LIMIT, (1,), generator=g) for g in generator]).long()
    else:
        rows = 1 if lengths is None else len(lengths)
        gen_device = generator.device if generator is not None else "cpu"
        seeds = torch.randint(0, SEED_LIMIT, (rows,), generator=generator, device=gen_device)
    return seeds.to(device) if device is not None else seeds


def check_keys(seeds, batch: int, n: int, device, lengths: torch.Tensor | None = None, values: bool = True):
    """Check a draw given by a caller: (1,) or (B,) integer seeds on q's device, and with ``values`` each in
    [0, 2**31) (a host sync: the model's boundary, never per layer)."""
    if not isinstance(seeds, torch.Tensor) or seeds.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"the random-keys draw must be an integer tensor of seeds (1,) or (B,), got {seeds!r}.")
    if seeds.dim() != 1 or seeds.shape[0] not in (1, batch):
        raise ValueError(f"the random-keys draw must have shape (1,) or ({batch},): one seed per row, got "
                         f"{tuple(seeds.shape)}.")
    if seeds.device != device:
        raise ValueError(f"the random-keys draw is on {seeds.device} but q is on {device}.")
    seeds = seeds.long()
    if values and not torch.compiler.is_compiling() and not bool(((seeds >= 0) & (seeds < SEED_LIMIT)).all()):
        raise ValueError("the random-keys seeds must lie in [0, 2**31); draw them with the variant's draw().")
    return seeds


def check_table(table, batch: int, n: int, device, lengths: torch.Tensor | None = None, values: bool = True):
    """Check a key table given to ``random_attention``: (n, K) or (1 or B, n, K) integers on q's device, and with
    ``values`` every entry -1 or an earlier key j < i of a valid query (a host sync)."""
    if not isinstance(table, torch.Tensor) or table.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"a key table must be an integer tensor (n, K) or (B, n, K), got {table!r}.")
    if table.dim() not in (2, 3) or table.shape[-2] != n or (table.dim() == 3 and table.shape[0] not in (1, batch)):
        raise ValueError(f"a key table must have shape ({n}, K) or ({batch}, {n}, K), got {tuple(table.shape)}.")
    if table.device != device:
        raise ValueError(f"the key table is on {table.device} but q is on {device}.")
    table = table.long()
    if values and table.numel() and not torch.compiler.is_compiling():
        i = torch.arange(n, device=device).view(-1, 1)
        ok = (table == -1) | ((table >= 0) & (table < i))
        if lengths is not None:
            t = table if table.dim() == 3 else table.unsqueeze(0)
            ok = ok & ((t == -1) | (i.view(1, n, 1) < lengths.view(-1, 1, 1)))
        if not bool(ok.all()):
            raise ValueError("a key table may hold only -1 and earlier keys j < i of each row's valid queries.")
    return table


def expected_width(window: int) -> int:
    """About the widest key table row: SA's budget and three standard deviations of a binomial degree."""
    per = budget(window)
    return int(per + 3 * math.sqrt(per)) + 1


def key_table(seeds: torch.Tensor, n: int, window: int, lengths: torch.Tensor | None = None, *,
              one_read_back: bool | None = None) -> torch.Tensor:
    """(1 or B, n, K) int64 on the seeds' device: row i the keys query i reads besides itself (the hash's pairs of
    ``masks.random_keys``), most recent first, -1 after them; K the most any query reads. Built over chunks of
    queries, each against the keys before it. K is read back to the host: per chunk on the CPU (free there), once
    per call elsewhere (the hash counted in a first pass, the table built in a second): the accelerator routes that
    build a table (sinks, ``backend: banded``, a head dim below FlexAttention's) sync once per layer; CUDA's
    default route, FlexAttention, builds none. ``one_read_back`` chooses the second way on any device (None: off
    the CPU)."""
    dev = seeds.device
    L = torch.full((1,), n, device=dev) if lengths is None else lengths.to(dev)
    rows = max(seeds.shape[0], L.shape[0])
    seed = (seeds.long().expand(rows) if seeds.shape[0] == 1 else seeds.long()).view(rows, 1, 1)
    L = (L.long().expand(rows) if L.shape[0] == 1 else L.long()).view(rows, 1, 1)
    thr = random_thresholds(L.view(-1), window).view(rows, 1, 1)
    chunk = max(1, _TABLE_ELEMENTS // max(1, rows * n))
    starts = range(0, n, chunk)

    def drawn(a: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = min(n, a + chunk)
        i = torch.arange(a, b, device=dev).view(1, -1, 1)
        j = torch.arange(b, device=dev).view(1, 1, -1)
        return (j < i) & (i < L) & (pair_hash(seed, i, j) < thr), j

    def keys_of(pairs: torch.Tensor, j: torch.Tensor, width: int) -> torch.Tensor:
        if not width:
            return pairs.new_empty(rows, pairs.shape[1], 0).long()
        return torch.where(pairs, j, -1).topk(width, dim=-1).values

    if not (dev.type != "cpu" if one_read_back is None else one_read_back):
        parts = []
        for a in starts:
            pairs, j = drawn(a)
            parts.append(keys_of(pairs, j, int(pairs.sum(-1).max())))
        width = max(p.shape[-1] for p in parts)
        return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[-1]), value=-1) for p in parts], 1)
    width = int(torch.stack([drawn(a)[0].sum(-1).amax() for a in starts]).amax())  # the one read-back
    return torch.cat([keys_of(*drawn(a), width) for a in starts], 1)


def random_attention(q, k, v, table: torch.Tensor, *, scale: float, skip_recent: int = 0,
                     lengths: torch.Tensor | None = None, validate: bool = True):
    """(output, log-sum-exp) of the random-keys pattern: query i reads itself and the keys of ``table[..., i, :]``
    (``skip_recent``: only the keys with i - j >= skip_recent, and not itself). q (B, Hq, n, d), k/v
    (B, Hkv, n, d), ``table`` (n, K) or (1 or B, n, K). Rows whose table is empty past padding read only
    themselves; a query with no key at all (``skip_recent``) gets output 0 and log-sum-exp -inf. ``table`` is
    checked (``check_table``; its values too unless ``validate`` is False)."""
    B, Hq, n, d = q.shape
    table = check_table(table, B, n, q.device, lengths, values=validate)
    Hkv = k.shape[1]
    G = Hq // Hkv
    table = table if table.dim() == 3 else table.unsqueeze(0)
    table = table.expand(B, -1, -1)
    i = torch.arange(n, device=q.device).view(1, n, 1)
    idx = table if skip_recent else torch.cat([i.expand(B, n, 1), table], -1)
    valid = (idx >= 0) & (i - idx >= skip_recent)
    # each kv head's keys as rows of one (B * n, d) matrix: a query's keys are whole rows, gathered in one
    # index_select and laid out (Hkv, B, queries, K, d) for a batched product with no further copy
    rows = idx.clamp(min=0) + (torch.arange(B, device=q.device) * n).view(B, 1, 1)
    kt = k.transpose(0, 1).reshape(Hkv, B * n, d)
    vt = v.transpose(0, 1).reshape(Hkv, B * n, d)
    low = q.dtype in (torch.float16, torch.bfloat16)
    chunk = max(1, _CHUNK_ELEMENTS // max(1, B * Hq * max(idx.shape[-1], 1) * d))
    starts = list(range(0, n, chunk))
    widths = _chunk_widths(valid, starts, chunk)
    outs, lses = [], []
    for a, K in zip(starts, widths):
        b = min(n, a + chunk)
        c = b - a
        at = rows[:, a:b, :K].reshape(-1)
        kg = kt.index_select(1, at).view(Hkv, B, c, K, d)
        vg = vt.index_select(1, at).view(Hkv, B, c, K, d)
        qg = q[:, :, a:b].reshape(B, Hkv, G, c, d).permute(1, 0, 3, 2, 4)  # (Hkv, B, c, G, d)
        scores = torch.matmul(qg, kg.transpose(-1, -2))  # (Hkv, B, c, G, K)
        scores = (scores.float() if low else scores) * scale
        scores = scores.masked_fill(~valid[:, a:b, :K].view(1, B, c, 1, K), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
        out = torch.matmul(probs.to(v.dtype), vg)  # (Hkv, B, c, G, d)
        outs.append(out.permute(1, 0, 3, 2, 4).reshape(B, Hq, c, d))
        lses.append(lse.permute(1, 0, 3, 2).reshape(B, Hq, c))
    return torch.cat(outs, 2), torch.cat(lses, 2)


def _chunk_widths(valid: torch.Tensor, starts: list[int], chunk: int) -> list[int]:
    """The table columns each chunk of queries needs: up to its last valid key. Early queries read few keys (about
    p * i), so trimming the table's full width per chunk halves the gathered bytes. It reads the widths back once
    per call: free on the host, one sync per layer on an accelerator in inference. Where a step must not sync (a
    gradient on an accelerator, or a compiled graph), every chunk keeps the table's full width."""
    K = valid.shape[-1]
    if (valid.device.type != "cpu" and torch.is_grad_enabled()) or torch.compiler.is_compiling() or K == 0:
        return [K] * len(starts)
    last = (valid * torch.arange(1, K + 1, device=valid.device)).amax(dim=(0, 2))  # (n,) last valid column + 1
    ends = torch.nn.functional.pad(last, (0, len(starts) * chunk - last.shape[0])).view(len(starts), chunk).amax(1)
    return [max(1, int(e)) for e in ends.tolist()]
