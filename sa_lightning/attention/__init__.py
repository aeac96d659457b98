"""The attention core: semantics, kernels, permutations, MoBA and the variant registry.

Importing it tunes glibc's malloc for the kernels' large short-lived buffers (see
``sa_lightning.utils.cpu_allocator``), so a kernel runs as fast from Python as from ``cli.py``. Opt out
with ``SA_LIGHTNING_DEFAULT_MALLOC=1`` before the import.
"""
from ..utils.cpu_allocator import tune_cpu_allocator
from .functional import (full_attention, moba_attention, sa_swa_attention, sa_swa_union_attention,
                         sliding_window_attention, stochastic_attention)
from .gating import GatedPaths
from .permutation import invert_permutation, layer_generator, sample_permutation
from .registry import VARIANTS, AttentionSpec, Variant, get_variant, register_variant

tune_cpu_allocator()

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
    "VARIANTS",
    "get_variant",
    "register_variant",
]
