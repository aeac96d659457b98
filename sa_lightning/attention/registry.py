"""The variant registry: one name -> implementation map for every caller.

The Transformer++ model, the Hugging Face patcher, the benchmarks and the analysis tools all resolve
``full | swa | sa | sa_swa | sa_swa_union | moba`` here. A variant returns one tensor per path; the caller gates and
sums the paths (see ``GatedPaths``) or, training-free, uses the single path as is.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import masks
from ._checks import check_nonnegative, check_positive
from .sinks import SINK_VARIANTS, sink_attention, with_sink
from .functional import (full_attention, moba_attention, sa_swa_attention, sa_swa_union_attention,
                         sliding_window_attention, stochastic_attention)


@dataclass(frozen=True)
class AttentionSpec:
    """What a layer needs to run a variant: the knobs every variant may read."""

    variant: str = "sa_swa"
    window: int = 256
    block_size: int = 64
    top_k: int = 2
    backend: str = "auto"
    #: attention sinks (beyond the paper): every query also reads the first ``sink`` keys of its row
    sink: int = 0

    def __post_init__(self):
        get_variant(self.variant)
        for name, check in (("window", check_positive), ("block_size", check_positive), ("top_k", check_positive),
                            ("sink", check_nonnegative)):
            object.__setattr__(self, name, check(name, getattr(self, name)))  # numpy and 0-d tensor ints: int
        if self.sink and self.variant not in SINK_VARIANTS:
            raise ValueError(f"sink applies to the variants {', '.join(SINK_VARIANTS)}, not {self.variant!r}.")


#: kernel(q, k, v, spec, perm, lengths, inv) -> one output per path. ``lengths`` (B,) marks right padding;
#: only SA needs it (its band wraps), the causal variants never read a later pad token anyway. ``inv`` is
#: ``perm``'s inverse when the caller precomputed it (None: the kernel inverts ``perm`` itself).
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionSpec, "torch.Tensor | None",
                   "torch.Tensor | None", "torch.Tensor | None"], tuple]
MaskBuilder = Callable[[AttentionSpec, int, "torch.Tensor | None"], masks.MaskMod]


@dataclass(frozen=True)
class Variant:
    name: str
    paths: tuple[str, ...]
    kernel: Kernel = field(repr=False)
    #: Builds the variant's mask function in original positions (None for data-dependent MoBA).
    mask: MaskBuilder | None = field(default=None, repr=False)
    uses_permutation: bool = False

    def __call__(self, q, k, v, spec: AttentionSpec, perm: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None, inv: torch.Tensor | None = None) -> tuple:
        return self.kernel(q, k, v, spec, perm, lengths, inv)


VARIANTS: dict[str, Variant] = {}


def register_variant(variant: Variant) -> Variant:
    VARIANTS[variant.name] = variant
    return variant


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), VARIANTS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown attention variant {name!r}; choose one of {', '.join(VARIANTS)}.{hint}") from None


def _slot_of(perm: torch.Tensor) -> torch.Tensor:
    from .permutation import invert_permutation

    return invert_permutation(perm if perm.dim() == 2 else perm.unsqueeze(0))


register_variant(Variant(
    "full", ("full",),
    lambda q, k, v, s, p, lens, inv: (full_attention(q, k, v),),
    mask=lambda s, n, p: masks.causal,
))
def _sinks(q, k, v, s, p, lens, inv) -> tuple:
    """A single-path variant with ``s.sink`` sink keys added (the spec refuses sinks elsewhere)."""
    return (sink_attention(q, k, v, s.variant, s.window, s.sink, p, lengths=lens, inv=inv),)


register_variant(Variant(
    "swa", ("swa",),
    lambda q, k, v, s, p, lens, inv: _sinks(q, k, v, s, p, lens, inv) if s.sink else
    (sliding_window_attention(q, k, v, s.window, backend=s.backend),),
    mask=lambda s, n, p: with_sink(masks.sliding_window(s.window), s.sink),
))
register_variant(Variant(
    "sa", ("sa",),
    lambda q, k, v, s, p, lens, inv: _sinks(q, k, v, s, p, lens, inv) if s.sink else
    (stochastic_attention(q, k, v, s.window, p, backend=s.backend, lengths=lens, inv=inv),),
    mask=lambda s, n, p: with_sink(masks.stochastic(_slot_of(p), s.window), s.sink),
    uses_permutation=True,
))
register_variant(Variant(
    "sa_swa", ("sa", "swa"),
    lambda q, k, v, s, p, lens, inv: sa_swa_attention(q, k, v, s.window, p, backend=s.backend, lengths=lens, inv=inv),
    mask=lambda s, n, p: masks.union(masks.stochastic(_slot_of(p), s.window), masks.sliding_window(s.window)),
    uses_permutation=True,
))
register_variant(Variant(
    "moba", ("moba",),
    lambda q, k, v, s, p, lens, inv: (moba_attention(q, k, v, s.block_size, s.top_k, backend=s.backend),),
))
# Training-free SA+SWA (the HF patcher's ``sa_swa`` mode): one softmax over the union of both masks.
register_variant(Variant(
    "sa_swa_union", ("sa_swa_union",),
    lambda q, k, v, s, p, lens, inv: _sinks(q, k, v, s, p, lens, inv) if s.sink else
    (sa_swa_union_attention(q, k, v, s.window, p, lengths=lens, inv=inv),),
    mask=lambda s, n, p: with_sink(masks.union(masks.stochastic(_slot_of(p), s.window),
                                               masks.sliding_window(s.window)), s.sink),
    uses_permutation=True,
))

