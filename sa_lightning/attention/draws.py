"""Each layer's randomness, drawn one way for every caller: σ for SA and its unions, the hash seeds of the
random control (whatever the variant's ``draw`` makes).

:func:`layer_draws` is the only place a draw is seeded. Two sources:

- **A run's stream** (the model in training): one generator per layer, from the run seed, or from the seed
  mixed with the training step by :func:`stream_seed` (``permutation: stochastic``), so a run is reproducible
  and a resumed run draws what the uninterrupted one did. The batch shares one draw (or, with ``lengths``,
  one per row that keeps its padding in place).
- **Each row's identity** (evaluation, generation, the Hugging Face patcher, the paper's §3.3): one
  generator per row and layer, from (seed, layer, the row's own tokens and draw index) in ``stochastic``
  ``sa_mode``, or (seed, layer, its length) in ``deterministic`` mode. A row's draw then depends on nothing
  else: neither the batch it sits in nor its padding changes it, and a rerun reproduces it.
- **A Transformer++'s fixed draw** (``fixed``: a model trained with ``permutation: deterministic`` or a ``frozen``
  variant such as fixed-σ SA): one per (model seed, layer, length), from ``layer_generator(seed, layer)`` alone
  (:func:`fixed_draws`). Training runs whole rows of one length, so every evaluation, export and generation of
  any batch draws for a row of that length exactly the σ the model trained with.

Draws are made on the host (the generators live there) and moved to ``device`` (:func:`to_device`): to a GPU
from pinned memory without blocking, so that drawing a step's layers never waits for the work already queued
(a blocking copy of pageable memory did, once per layer), and no kernel reads them back.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import torch

from .permutation import layer_generator

#: how evaluation and training-free inference draw (paper §3.3): ``stochastic`` (the default, as in the paper)
#: draws each input's own from (seed, layer, the row's tokens); ``deterministic`` fixes one per (seed, layer,
#: length), shared by every input of that length.
SA_MODES = ("stochastic", "deterministic")


def stream_seed(seed: int, stream: int) -> int:
    """Mix the run seed with a step counter into one 62-bit seed (distinct streams never collide in practice)."""
    return (int(seed) * 0x9E3779B97F4A7C15 + int(stream) * 0xBF58476D1CE4E5B9 + 1) % (2**62)


def row_key(tokens: Sequence[int], sample: int = 0) -> tuple:
    """What identifies an input for its stochastic draw: its token ids (only its own, never padding) and the
    draw index ``sample`` (``eval_samples`` averages several draws)."""
    return (int(sample), hashlib.blake2b(str([int(t) for t in tokens]).encode("ascii"), digest_size=16).digest())


def _row_seed(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 2


def row_identities(rows: Sequence[Sequence[int]] | Sequence[int], mode: str = "stochastic", sample: int = 0,
                   keys: Sequence[tuple] | None = None) -> list:
    """What seeds each row's draw: its ``row_key`` (stochastic; ``keys`` if already hashed) or its length
    (deterministic, where ``rows`` may hold just the lengths)."""
    if mode not in SA_MODES:
        raise ValueError(f"sa_mode must be one of {', '.join(SA_MODES)}, got {mode!r}.")
    if mode == "deterministic":
        return [r if isinstance(r, int) else len(r) for r in rows]
    if keys is not None:
        return list(keys)
    if any(isinstance(r, int) for r in rows):
        raise ValueError("a stochastic draw needs each row's tokens (or their row_key), not only lengths.")
    return [row_key(r, sample) for r in rows]


def layer_draws(variant, spec, n: int, layers: Iterable[int], *, seed: int, device=None,
                lengths: torch.Tensor | None = None, rows: Sequence | None = None, mode: str = "stochastic",
                sample: int = 0, keys: Sequence[tuple] | None = None, fixed: bool = False
                ) -> list[torch.Tensor | None]:
    """The draw of each layer in ``layers`` for an input of width n (None for a variant that draws nothing).

    Without ``rows``: one generator per layer from ``seed`` (mix a training step in with ``stream_seed``);
    ``lengths`` (B,) for a right-padded batch. With ``rows`` (each right-padded row's tokens, or its length in
    deterministic ``mode``): one generator per row and layer, from (seed, layer, ``row_identities``).
    ``fixed`` (a Transformer++ that trained with one draw per layer; ``seed`` is its model seed): ``fixed_draws``,
    with or without ``rows``, whatever ``mode``, ``sample`` and ``keys`` say."""
    layers = list(layers)
    if not variant.draws:
        return [None] * len(layers)
    if fixed:
        sizes = None if rows is None else [r if isinstance(r, int) else len(r) for r in rows]
        return fixed_draws(variant, spec, n, layers, seed=seed, device=device,
                           sizes=sizes if lengths is None else [int(x) for x in lengths])
    if rows is None:
        return [to_device(variant.draw(spec, n, lengths, layer_generator(seed, layer)), device) for layer in layers]
    if variant.frozen:  # one draw per (seed, layer, length), whatever the input or the draw index
        mode, keys = "deterministic", None
    identity = row_identities(rows, mode, sample, keys)
    sizes = [r if isinstance(r, int) else len(r) for r in rows]

    def generators(layer):
        return [torch.Generator().manual_seed(_row_seed(int(seed), int(layer), key)) for key in identity]

    return [to_device(variant.draw(spec, n, sizes, generators(layer)), device) for layer in layers]


def fixed_draws(variant, spec, n: int, layers: Iterable[int], *, seed: int, device=None,
                sizes: Sequence[int] | None = None) -> list[torch.Tensor]:
    """A Transformer++'s fixed draw of each layer in ``layers`` (``layer_draws(fixed=True)``): one per (seed, layer,
    length), each from a fresh ``layer_generator(seed, layer)``. Without ``sizes`` the batch shares the draw at width
    n (training); with them (each right-padded row's length) row b holds the draw at its own length, so neither the
    batch nor the padding changes a row's, and a row of the training length draws exactly what training drew."""
    if sizes is None:
        return [to_device(variant.draw(spec, n, None, layer_generator(seed, layer)), device) for layer in layers]
    return [to_device(variant.draw(spec, n, list(sizes), [layer_generator(seed, layer) for _ in sizes]), device)
            for layer in layers]


def to_device(drawn: torch.Tensor, device) -> torch.Tensor:
    """A host draw on ``device``: to a CUDA device through pinned memory with ``non_blocking`` (the host goes on
    at once; the caching host allocator keeps the pinned block until the copy has run), elsewhere as is."""
    if device is None:
        return drawn
    device = torch.device(device)
    if device.type == "cuda" and drawn.device.type == "cpu":
        return drawn.pin_memory().to(device, non_blocking=True)
    return drawn.to(device)

