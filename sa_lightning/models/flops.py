"""Training FLOPs per token, counting the attention a variant computes (for tokens/s -> MFU).

    flops/token = 6 * N  +  12 * L * d * keys

``N`` is the non-embedding parameter count (the LM head is a matmul per token and counts; the input
embedding is a lookup and does not). A matmul of an m x k by a k x n matrix is 2mkn FLOPs, and training
is a forward (1x) plus a backward (2x): 6 per weight per token. Attention adds, per layer and token, a
query-key product and a weighted sum of values over ``keys`` keys of width d (= n_head x head_dim):
2 * 2 * d * keys forward, times 3 for training, 12 * d * keys. ``keys`` is what each query's kernel
computes, not what the mask keeps:

- ``full``: n / 2 (causal: a fused kernel skips the blocks above the diagonal);
- ``swa`` and ``sa``: w (the banded kernel computes a band of w keys per query; SA's causal mask then
  keeps about half of its band, but the band is computed);
- ``sa_swa`` and ``sa_swa_union``: 2w (two bands);
- ``moba``: block_size * top_k, at most n / 2;
- every count is at most n (a window longer than the sequence computes the whole causal row).

Counting n / 2 (or n) keys for a windowed variant, as a "6N + dense attention" formula does, credits it
with work it never does, and overstates its MFU.
"""
from __future__ import annotations


def keys_per_query(variant: str, seq_len: int, window: int, block_size: int, top_k: int) -> float:
    """Keys each query's kernel computes, per attention path summed (see the module docstring)."""
    if variant == "full":
        return seq_len / 2
    if variant == "moba":
        return min(seq_len / 2, block_size * top_k)
    paths = 2 if variant in ("sa_swa", "sa_swa_union") else 1
    return paths * min(window, seq_len)


def train_flops_per_token(cfg, seq_len: int, non_embedding_params: int) -> float:
    """6N + 12 L d keys for a ``ModelConfig`` (``cfg.variant``, ``window``, ``moba_*``, ``n_layer``, ``d_model``)."""
    keys = keys_per_query(cfg.variant, seq_len, cfg.window, cfg.moba_block_size, cfg.moba_top_k)
    return 6 * non_embedding_params + 12 * cfg.n_layer * cfg.d_model * keys
