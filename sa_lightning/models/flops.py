"""Training FLOPs per token, counting the attention a variant computes (for tokens/s -> MFU).

    flops/token = 6 * N  +  12 * L * d * keys

``N`` counts the weights each token is multiplied by (``matmul_params``): every parameter except the input
embedding table, which is a lookup, with the LM head counted even when it is tied to that table (the
Transformer++ and the Qwen3 backbone tie it): the head is a d x vocab matmul per token all the same. The
norm gains are counted too (a few thousand weights; the convention of counting all parameters). A matmul
of an m x k by a k x n matrix is 2mkn FLOPs, and training is a forward (1x) plus a backward (2x): 6 per
weight per token. Attention adds, per layer and token, a query-key product and a weighted sum of values
over ``keys`` keys of width d (= n_head x head_dim): 2 * 2 * d * keys forward, times 3 for training,
12 * d * keys. ``keys`` is what each query's kernel computes, not what the mask keeps (each variant's
``keys_computed`` in the registry):

- ``full``: n / 2 (causal: a fused kernel skips the blocks above the diagonal);
- ``swa`` and ``sa``: w (the banded kernel computes a band of w keys per query; SA's causal mask then
  keeps about half of its band, but the band is computed);
- ``sa_swa`` and ``sa_swa_union``: 2w (two bands);
- ``moba``: block_size * top_k, at most n / 2;
- every count is at most n (a window longer than the sequence computes the whole causal row).

Counting n / 2 (or n) keys for a windowed variant, as a "6N + dense attention" formula does, credits it
with work it never does, and overstates its MFU; leaving a tied LM head out of N understates every
variant's (by 6 * 4096 * 128 = 3.1M of the 9.0M FLOPs per token of the tiny SA+SWA model, by
6 * 32000 * 1024 = 0.20G of the 2.46G of the 360M one at n = 2048).
"""
from __future__ import annotations

from torch import nn

from ..attention import get_variant


def matmul_params(model: nn.Module) -> int:
    """N of 6N: the parameters (each counted once) that a token's forward multiplies by; every one but an
    input embedding table, unless that table is also the LM head (``model.lm_head``)."""
    head = model.lm_head.weight
    lookups = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding) and m.weight is not head)
    return sum(p.numel() for p in model.parameters()) - lookups


def train_flops_per_token(cfg, seq_len: int, params: int) -> float:
    """6N + 12 L d keys for a ``ModelConfig`` (its ``attention``, ``n_layer`` and ``d_model``); ``params`` is N,
    the model's ``matmul_params``."""
    att = cfg.attention.at_depth(cfg.n_layer)  # the controls' patterns for the model's layers, as it runs them
    keys = get_variant(att.variant).keys_computed(att, seq_len)
    return 6 * params + 12 * cfg.n_layer * cfg.d_model * keys
