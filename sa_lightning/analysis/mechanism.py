"""Monte Carlo checks of SA's theory (paper Sec. 3.2 and Appendix A).

Two conventions:
- ``theory``: the circular, non-causal window |i - j|_n < w/2 of Appendix A (Figure 2, left).
- ``causal``: the masks the models run, taken from the variant registry.
"""
from __future__ import annotations

import math

import torch

from ..attention import VARIANTS, AttentionSpec, get_variant, masks, sample_permutation, stochastic_attention
from ..attention.permutation import invert_permutation
from ..attention.bucketed import bucket_size
from ..attention.variants import SA, SA_BUCKET, SWA

CONVENTIONS = ("theory", "causal")
#: the variants whose adjacency is known before the scores, from their mask (MoBA's blocks are picked by content)
PATTERNED = tuple(name for name, v in VARIANTS.items() if v.mask is not None)


class LayerSampler:
    """Draws the (n, n) bool adjacency of fresh layers: [i, j] is True when token i reads token j. ``depth``: the
    layers of the model the masks stand for (the deterministic controls tune their pattern for it,
    ``AttentionSpec.depth``); None: their fewest-layers pattern."""

    def __init__(self, variant: str, n: int, window: int, convention: str = "theory", depth: int | None = None):
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}.")
        if get_variant(variant).mask is None:
            raise ValueError(f"{variant} has no pattern fixed before the scores (its blocks are picked by content); "
                             f"the mechanism tools take {', '.join(PATTERNED)}.")
        self.variant, self.n, self.window, self.convention = variant, n, window, convention
        self.spec = AttentionSpec(variant, window=window, depth=depth)
        self.drawn = get_variant(variant).draws
        idx = torch.arange(n)
        # Appendix A's circular window, in token space; SA applies it in slot space.
        self.local = masks.circular_distance(idx.view(-1, 1), idx.view(1, -1), n) <= masks.sa_half_width(window)

    def _theory(self, perm: torch.Tensor | None) -> torch.Tensor:
        variant = get_variant(self.variant)
        if not variant.sparse:
            return torch.ones(self.n, self.n, dtype=torch.bool)
        if variant.name == SWA.name:
            return self.local
        if not (variant.uses_permutation and variant.circular):  # another pattern (the controls, the buckets):
            # its own mask, read both ways
            own = masks.dense(variant.mask(self.spec, self.n, perm), self.n)[0, 0]
            return own | own.T
        slot = invert_permutation(perm)
        shuffled = self.local[slot][:, slot]
        return shuffled | self.local if variant.local_paths else shuffled  # SA+SWA: both windows

    def draw(self, generator: torch.Generator) -> torch.Tensor:
        spec = self.spec
        perm = get_variant(self.variant).draw(spec, self.n, None, generator) if self.drawn else None
        if self.convention == "theory":
            return self._theory(perm)
        if not get_variant(self.variant).sparse:
            return torch.ones(self.n, self.n, dtype=torch.bool).tril()
        return masks.dense(get_variant(self.variant).mask(spec, self.n, perm), self.n)[0, 0]


def coverage_curve(variant: str, n: int, window: int, depth: int, *, trials: int = 8, sources: int = 64,
                   convention: str = "theory", seed: int = 0, progress=None, every: float = 30.0) -> torch.Tensor:
    """Mean fraction of the visible sequence that reaches a token after 0..depth layers.

    Layers are i.i.d., so growing the receptive set one fresh layer at a time has the same law as
    stacking layers on top. Under ``causal`` token i can see i + 1 tokens, and coverage is relative
    to that. ``progress(line)``, if given, hears where the draws are at least every ``every`` seconds.
    """
    import time

    last = time.monotonic()
    sampler = LayerSampler(variant, n, window, convention)
    gen = torch.Generator().manual_seed(seed)
    curve = torch.zeros(depth + 1, dtype=torch.float64)
    if not get_variant(variant).draws:
        trials = 1  # a fixed pattern: one pass is exact for the sampled tokens
    for _ in range(trials):
        tokens = torch.randperm(n, generator=gen)[:sources]
        reach = torch.zeros(len(tokens), n)
        reach[torch.arange(len(tokens)), tokens] = 1.0
        visible = n if convention == "theory" else (tokens + 1).double()
        curve[0] += (reach.sum(1) / visible).mean()
        for layer in range(1, depth + 1):
            adjacency = sampler.draw(gen).float()
            reach = ((reach @ adjacency) > 0).float()
            curve[layer] += (reach.sum(1).double() / visible).mean()
            if progress is not None and time.monotonic() - last >= every:
                last = time.monotonic()
                progress(f"coverage {variant}: draw {_ + 1} of {trials}, layer {layer} of {depth}")
    return curve / trials


def reach_by_distance(variant: str, n: int, window: int, depth: int, *, trials: int = 16, seed: int = 0
                      ) -> torch.Tensor:
    """(n,) float64: entry d is the chance that the last query of a row of n tokens reaches the key d tokens back
    through ``depth`` layers of the variant's own causal masks (exact for a fixed pattern; over ``trials`` draws of
    every layer for one that draws), each built as a model of ``depth`` layers runs it (the deterministic controls'
    patterns tuned for that depth, ``AttentionSpec.depth``). What a control must show before it stands against SA:
    that its mask can carry the answer of a task from the key to the query at all (``strided`` alone reaches only
    multiples of its stride)."""
    sampler = LayerSampler(variant, n, window, "causal", depth=depth if depth >= 1 else None)
    gen = torch.Generator().manual_seed(seed)
    trials = trials if get_variant(variant).draws else 1
    hits = torch.zeros(n, dtype=torch.float64)
    for _ in range(trials):
        reach = torch.zeros(n)
        reach[n - 1] = 1.0
        for _ in range(depth):
            reach = ((reach @ sampler.draw(gen).float()) > 0).float()  # the keys the reached tokens read
        hits += reach.double().flip(0)  # index d: the token d back from the query
    return hits / trials


def reach_share(variant: str, n: int, window: int, depth: int, lo: int, *, trials: int = 16, seed: int = 0) -> float:
    """The mean chance, over the distances d in [lo, n - 1], that ``reach_by_distance`` carries the key to the query:
    1.0 for a mask that reaches every such distance in ``depth`` layers."""
    if lo > n - 1:
        return math.nan
    return float(reach_by_distance(variant, n, window, depth, trials=trials, seed=seed)[lo:].mean())


def layers_to_cover(curve: torch.Tensor, level: float = 0.99) -> int | None:
    hit = (curve >= level).nonzero()
    return int(hit[0]) if len(hit) else None


def connection_probability(n: int, window: int, *, trials: int = 200, seed: int = 0) -> dict:
    """Chance that a fixed pair i != j shares an SA window: measured, exact, paper, approximate.

    The paper's mask |slot(i) - slot(j)|_n < w/2 holds 2*ceil(w/2) - 1 slots, so the exact chance is
    (2*ceil(w/2) - 2) / (n - 1); the paper writes (w - 1) / (n - 1), which agrees for odd w. The
    measurement follows fixed pairs at distance 1 (neighbours) and n/2 (far apart) over ``trials``
    permutations, to show that the chance does not depend on distance.

    Bucketed SA (``sa_bucket``) beside it, from the same permutations: a pair shares a bucket of b = 2⌈w/2⌉ − 1
    consecutive slots with chance (q b (b − 1) + r (r − 1)) / (n (n − 1)) for n = q b + r, which is SA's
    (b − 1)/(n − 1) where b divides n.
    """
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.arange(n)
    hits = {name: [0.0, 0.0] for name in (SA.name, SA_BUCKET.name)}
    samplers = {name: LayerSampler(name, n, window) for name in hits}
    for _ in range(trials):
        perm = sample_permutation(n, generator=gen)
        for name in hits:
            m = samplers[name]._theory(perm)
            hits[name][0] += m[tokens, (tokens + 1) % n].double().mean().item()
            hits[name][1] += m[tokens, (tokens + n // 2) % n].double().mean().item()
    (near_hits, far_hits), (bucket_near, bucket_far) = hits[SA.name], hits[SA_BUCKET.name]
    slots = min(n, masks.sa_band_others(window) + 1)
    b = min(n, bucket_size(window))
    full, rest = divmod(n, b)
    return {
        "n": n,
        "window": window,
        "measured_near": near_hits / trials,
        "measured_far": far_hits / trials,
        "exact": (slots - 1) / (n - 1),
        "paper": (window - 1) / (n - 1),
        "approx_w_over_n": window / n,
        "paper_causal_average": (window - 1) / (2 * (n - 1)),
        "bucket_measured_near": bucket_near / trials,
        "bucket_measured_far": bucket_far / trials,
        "bucket_exact": (full * b * (b - 1) + rest * (rest - 1)) / (n * (n - 1)),
    }


def uniform_attention_moments(n: int, window: int, *, trials: int = 256, d: int = 16, seed: int = 0) -> dict:
    """Bias and variance of SA against uniform full attention at infinite temperature (scale=0).

    Uses the real kernel and the last token, which sees the whole sequence causally, so Appendix A's
    setting holds exactly: the output is the mean of V over itself and 2*ceil(w/2) - 2 random others.
    """
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(1, 1, n, d, generator=gen)
    q = torch.zeros(1, 1, n, d)
    outs = torch.stack([
        stochastic_attention(q, v, v, window, sample_permutation(n, generator=gen), scale=0.0)[0, 0, -1]
        for _ in range(trials)
    ]).double()
    target = v[0, 0].double().mean(0)
    spread = ((v[0, 0].double() - target) ** 2).sum(1).mean().item()  # sigma_V^2
    others = min(n, masks.sa_band_others(window) + 1) - 1  # the window holds the token itself + others
    return {
        "n": n,
        "window": window,
        "bias": (outs.mean(0) - target).norm().item(),
        "variance": ((outs - outs.mean(0)) ** 2).sum(1).mean().item(),
        # the mean of self + `others` values drawn without replacement from the other n - 1
        "sampling_variance": spread * others / (others + 1) ** 2 * (n - 1 - others) / max(n - 2, 1),
        "paper_bound": spread / window,
    }


# ---- bounds: absurd sizes are refused before any draw ------------------------------------------------------
#: bytes one n-token layer holds per entry of its (n, n) mask while it is drawn and applied (the int64 distances
#: of the circular window, the bool mask, its float copy): the peak measured at n = 4096, 24 n² bytes for every
#: variant (the graph checks, with their dense float64 operators and images, give their own to ``check_size``)
BYTES_PER_ENTRY = 24
#: nanoseconds one mask entry costs, drawn and applied, on one CPU core: measured 20-150 ns at n = 2048 (SWA the
#: least, the random control the most) on the 2-core machine the tests run on, 2026-12; ``check_size`` takes 50
NS_PER_ENTRY = 50
#: nanoseconds per n³ of a dense product or eigendecomposition of an (n, n) matrix (the graph checks), on one core:
#: ``analyze spectrum --n 1024 --layers 4`` (15 of them) took 63 s on that machine
NS_PER_CUBE = 4
#: the longest an estimate may come to before the work is refused up front: a day
MAX_SECONDS = 24 * 3600


def available_bytes() -> int:
    """The memory this machine can still give (``MemAvailable``), or a huge number where it cannot say."""
    try:
        with open("/proc/meminfo") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 1 << 62


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.0f} {unit}"
    return f"{seconds:.0f} s"


def check_size(what: str, n: int, draws: int, fix: str, cubes: int = 0, note: str = "",
               bytes_per_entry: int = BYTES_PER_ENTRY, memory_fix: str | None = None) -> float:
    """Refuse in one sentence, before any draw, work whose (n, n) masks (``bytes_per_entry`` n² bytes) do not fit
    in 60% of this machine's free memory, or whose estimate (``draws`` layers of n² entries at ``NS_PER_ENTRY``,
    ``cubes`` dense n³ products at ``NS_PER_CUBE``) passes ``MAX_SECONDS``: ``what`` names the command and its sizes,
    ``fix`` the way out (``memory_fix`` that of the memory, if another), ``note`` (if any) goes after the estimate.
    Returns the estimate in seconds."""
    need, free = bytes_per_entry * n * n, available_bytes()
    if need > 0.6 * free:
        raise ValueError(f"{what} holds {n:,} × {n:,} masks, about {need / 2**30:,.1f} GiB, more than 60% of this "
                         f"machine's free memory ({free / 2**30:,.1f} GiB); {memory_fix or fix}.")
    seconds = (draws * n * n * NS_PER_ENTRY + cubes * n ** 3 * NS_PER_CUBE) / 1e9
    if seconds > MAX_SECONDS:
        also = f" and takes {cubes:,} dense products of them" if cubes else ""
        raise ValueError(f"{what} draws {draws:,} layers of {n:,} × {n:,} masks{also}: about {_duration(seconds)} on "
                         f"a CPU core (~{NS_PER_ENTRY} ns a mask entry), and work estimated past "
                         f"{_duration(MAX_SECONDS)} is refused up front{note}; {fix}.")
    return seconds


def check_reach_grid(n: int, trials: int, depths, windows, draws: int) -> None:
    """``study reach``'s grid before any cell: n, trials and depths in range, a distance past SWA's field at every
    depth and window (reach is measured only there), and a size this machine can hold and draw in a day
    (``check_size``; ``draws``: the layers drawn over every cell)."""
    from itertools import product

    for key, value, least, what in (("n", n, 2, "the row's tokens"), ("trials", trials, 1,
                                                                      "draws of every layer per seed")):
        if value < least:
            raise ValueError(f"{key} must be an integer >= {least} ({what}), got {value}; nothing was run.")
    if min(depths) < 1:
        raise ValueError(f"depths must be integers >= 1 (layers stacked), got {list(depths)}; nothing was run.")
    depth, window = max(product(depths, windows), key=lambda dw: dw[0] * (dw[1] - 1))
    field = depth * (window - 1)
    if n < field + 2:
        raise ValueError(f"n: {n} leaves no key–query distance past SWA's field L·(w−1) = {field} at depth {depth} "
                         f"and window {window} (the row's farthest distance is n − 1 = {n - 1}), and reach is "
                         f"measured past it: n must be at least L·(w−1) + 2 = {field + 2} for every depth and window; "
                         "raise n or lower the depths or windows. Nothing was run.")
    check_size(f"study reach at n = {n}", n, draws, "lower n, trials or depths, or take fewer seeds, variants or "
               "windows; nothing was run", memory_fix="lower n; nothing was run")
