"""The attention core: semantics, kernels, permutations, MoBA and the variant registry."""
from .functional import (full_attention, moba_attention, sa_swa_union_attention, sliding_window_attention,
                         stochastic_attention)
from .gating import GatedPaths
from .permutation import invert_permutation, layer_generator, sample_permutation
from .registry import VARIANTS, AttentionSpec, Variant, get_variant, register_variant

__all__ = [
    "full_attention",
    "sliding_window_attention",
    "stochastic_attention",
    "moba_attention",
    "sa_swa_union_attention",
    "sample_permutation",
    "invert_permutation",
    "layer_generator",
    "GatedPaths",
    "AttentionSpec",
    "Variant",
    "VARIANTS",
    "get_variant",
    "register_variant",
]
