"""The Transformer++ as a transformers model: ``SATransformerConfig`` and ``SATransformerForCausalLM``.

The network inside is the very ``Transformer`` that ``cli.py fit`` trains (same modules, same registry
kernels), so an exported folder gives the Lightning checkpoint's logits.
``sa_lightning.register_with_transformers()`` registers both classes with ``AutoConfig`` and
``AutoModelForCausalLM`` (``register``), and ``generate`` works
through transformers' ``DynamicCache``:

- **Prefill** (the first call, empty cache) runs the variant. SA draws sigma per input from
  (``sa_seed``, layer, the row's own tokens), exactly as ``SALM`` evaluation does; padding (left, as
  ``generate`` pads, or right) is never attended and never changes a row's sigma.
- **Decoding** (every later call) attends the cache as ``decode`` says. ``dense`` (the default, the
  paper's choice for training-free inference): every path reads every cached key. ``window``: the
  local-window paths (``swa``, and gated ``sa_swa``'s SWA path) read only the last ``w`` keys.

What decoding means for SA. Exact SA for a new token would draw a fresh sigma over all n + 1 tokens,
which moves every earlier token to a new slot: their keys and values, and every hidden state above
them, change, so nothing could be cached and each token would cost a full prefill. So the prompt is
encoded once under its sigma, and a new token reads the whole cache. This is a superset of any window
it could have drawn, and the keys it reads were computed exactly as in training. The model never saw a
query attend densely during training. What that costs has not been measured yet; ``cli.py evaluate`` runs
this decode path on the ``generate_until`` tasks (the pass-key tasks), where an exported ``decode: dense``
and ``decode: window`` model of the same checkpoint can be compared.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .hf_cache import CACHE
from .hf_config import SATransformerConfig
from .transformer import Transformer, _attend, rope_tables


class SATransformerForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = SATransformerConfig
    base_model_prefix = "model"
    _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}
    _no_split_modules = ["Block"]
    _skip_keys_device_placement = ["cache", "past_key_values"]

    def __init__(self, config: SATransformerConfig, transformer: Transformer | None = None):
        super().__init__(config)
        self.model = transformer if transformer is not None else Transformer(config.to_model_config())
        self.post_init()

    @classmethod
    def from_transformer(cls, transformer: Transformer, **inference) -> "SATransformerForCausalLM":
        """Wraps a trained ``Transformer`` (shares its weights, copies nothing)."""
        return cls(SATransformerConfig.from_model_config(transformer.cfg, **inference), transformer)

    def _init_weights(self, module):  # the Transformer initializes itself (reset_parameters)
        pass

    def get_input_embeddings(self):
        return self.model.embed

    def set_input_embeddings(self, value):
        self.model.embed = value

    def get_output_embeddings(self):
        return self.model.lm_head

    # ---- sigma and padding ---------------------------------------------------------------------
    def draws(self, rows: list[list[int]], n: int) -> list[torch.Tensor] | None:
        """Per layer, the draw (σ, a key table) for right-padded ``rows``, as ``SALM`` draws it."""
        return self.model.row_draws(rows, n, seed=self.config.sa_seed, mode=self.config.sa_mode, device=self.device)

    @staticmethod
    def _shifts(attention_mask: torch.Tensor) -> torch.Tensor:
        """Each row's count of leading pads; refuses a mask whose ones are not one contiguous run."""
        mask = attention_mask.bool()
        lengths = mask.sum(1)
        shift = mask.int().argmax(1)
        expected = (torch.arange(mask.shape[1], device=mask.device) >= shift[:, None]) & \
                   (torch.arange(mask.shape[1], device=mask.device) < (shift + lengths)[:, None])
        if not torch.equal(expected, mask) or bool((lengths == 0).any()):
            raise ValueError("attention_mask must mark one contiguous run of tokens per row (left or right "
                             "padding), with at least one token.")
        return shift

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None,
                cache: Cache | None = None, use_cache: bool | None = None,
                permutations: list[torch.Tensor] | None = None, logits_to_keep: int = 0,
                labels: torch.LongTensor | None = None, past_key_values: Cache | None = None,
                **kwargs) -> CausalLMOutputWithPast:
        """Logits for ``input_ids``. With an empty cache this is a prefill through the variant's kernel;
        with a filled one, the new tokens decode against it (``config.decode``). ``permutations`` (per
        layer, (B, n), right-padded rows) replaces the drawn sigma in a prefill. The KV cache comes as
        ``cache`` (transformers >= 5.24) or ``past_key_values`` (older versions), and goes back under the
        name the installed transformers reads (``hf_cache.CACHE``)."""
        if past_key_values is not None:
            if cache is not None and cache is not past_key_values:
                raise ValueError("pass the KV cache as cache or as past_key_values, not both.")
            cache = past_key_values
        if cache is not None and not isinstance(cache, Cache):
            raise ValueError(f"cache must be a transformers Cache (such as DynamicCache), got {type(cache).__name__}.")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache()
        past = cache.get_seq_length() if cache is not None else 0
        B, t = input_ids.shape
        total = past + t
        if attention_mask is None:
            attention_mask = torch.ones(B, total, dtype=torch.long, device=input_ids.device)
        if attention_mask.shape[1] != total:
            raise ValueError(f"attention_mask covers {attention_mask.shape[1]} tokens, but the cache holds {past} "
                             f"and the input {t}.")
        positions = attention_mask.long().cumsum(1) - 1  # each token's position in its own row
        if int(positions.max()) >= self.config.max_position_embeddings:
            raise ValueError(f"sequence length {int(positions.max()) + 1} exceeds the model's "
                             f"max_seq_len={self.config.max_position_embeddings}.")
        if past == 0:
            hidden = self._prefill_prompt(input_ids, attention_mask, cache, permutations)
        else:
            hidden = self._decode_step(input_ids, attention_mask, positions, cache)
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.model.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE: cache if use_cache else None})

    def _prefill_prompt(self, input_ids, attention_mask, cache, permutations):
        """The variant over each row's own tokens: rows are rolled to right padding (what the kernels take),
        run as ``Transformer.features`` runs them, and rolled back."""
        net, (B, n) = self.model, input_ids.shape
        shift = self._shifts(attention_mask)
        lengths = attention_mask.bool().sum(1)
        cols = (torch.arange(n, device=input_ids.device)[None, :] + shift[:, None]) % n  # left pads -> the end
        idx = input_ids.gather(1, cols)
        padded = bool((lengths < n).any())
        if permutations is None:
            rows = [idx[b, :int(lengths[b])].tolist() for b in range(B)]
            permutations = self.draws(rows, n) or [None] * len(net.blocks)
        cos, sin = rope_tables(n, net.cfg.head_dim, net.cfg.rope_theta, device=idx.device)
        x = net.embed(idx)
        back = (torch.arange(n, device=idx.device)[None, :] - shift[:, None]) % n
        for layer, (block, perm) in enumerate(zip(net.blocks, permutations)):
            attn = block.attn
            q, k, v = attn.heads(block.attn_norm(x), cos, sin)
            if cache is not None:  # the cache keeps the caller's layout (left pads stay left)
                unroll = back[:, None, :, None].expand_as(k)
                cache.update(k.gather(2, unroll), v.gather(2, unroll), layer)
            paths = _attend(attn.variant, q, k, v, attn.spec, perm, lengths if padded else None)
            x = x + attn.output(paths)
            x = x + block.mlp(block.mlp_norm(x))
        return net.norm(x).gather(1, back[:, :, None].expand(B, n, x.shape[-1]))

    def _decode_step(self, input_ids, attention_mask, positions, cache):
        """New tokens against the cache: every cached key of the row (``dense``), or for local-window paths
        the keys at most w - 1 positions back, plus the sink keys (``window``)."""
        net, t = self.model, input_ids.shape[1]
        spec = net.cfg.attention
        qpos = positions[:, -t:]
        cos, sin = rope_tables(int(positions.max()) + 1, net.cfg.head_dim, net.cfg.rope_theta, device=input_ids.device)
        cos, sin = cos[qpos][:, None], sin[qpos][:, None]  # (B, 1, t, hd)
        valid = attention_mask.bool()[:, None, :]  # (B, 1, S)
        seen = valid & (positions[:, None, :] <= qpos[:, :, None])  # causal in each row's positions
        near = seen & ((qpos[:, :, None] - positions[:, None, :] < spec.window) | (positions[:, None, :] < spec.sink))
        local = self.config.decode == "window"
        x = net.embed(input_ids)
        for layer, block in enumerate(net.blocks):
            attn = block.attn
            q, k, v = attn.heads(block.attn_norm(x), cos, sin)
            k, v = cache.update(k, v, layer)
            paths = []
            for name in attn.variant.paths:
                mask = near if local and name in attn.variant.local_paths else seen
                paths.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True))
            x = x + attn.output(tuple(paths))
            x = x + block.mlp(block.mlp_norm(x))
        return net.norm(x)


def register() -> None:
    """Makes ``AutoModelForCausalLM`` build the folders ``cli.py export`` writes
    (``sa_lightning.register_with_transformers`` and ``models.sources``' loaders call it)."""
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    AutoModelForCausalLM.register(SATransformerConfig, SATransformerForCausalLM, exist_ok=True)
