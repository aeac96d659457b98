"""The attention core: semantics, kernels, permutations, MoBA and the variant registry (``variants/``: one
file per variant).

Importing it changes nothing in the process. The command line tunes glibc's malloc for the kernels' large
short-lived buffers (``sa_lightning.utils.cpu_allocator.tune_cpu_allocator``); call that from a script of your
own for the same speed.
"""
from .functional import (full_attention, moba_attention, sa_swa_attention, sa_swa_union_attention,
                         sliding_window_attention, stochastic_attention)
from .gating import GatedPaths
from .permutation import invert_permutation, layer_generator, sample_permutation
from .registry import (VARIANTS, AttentionSpec, Call, Variant, get_variant, register_variant, sigma_seeds,
                       trained_variant_names, variant_label, variant_names)

__all__ = [
    "full_attention",
    "sliding_window_attention",
    "stochastic_attention",
    "moba_attention",
    "sa_swa_attention",
    "sa_swa_union_attention",
    "sample_permutation",
    "invert_permutation",
    "layer_generator",
    "GatedPaths",
    "AttentionSpec",
    "Variant",
    "Call",
    "variant_names",
    "trained_variant_names",
    "variant_label",
    "VARIANTS",
    "get_variant",
    "register_variant",
    "sigma_seeds",
]
