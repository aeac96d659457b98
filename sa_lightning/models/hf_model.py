"""The Transformer++ as a transformers model: ``SATransformerConfig`` and ``SATransformerForCausalLM``.

The network inside is the very ``Transformer`` that ``cli.py fit`` trains (same modules, same registry
kernels, one call of ``Transformer.features`` per forward), so an exported folder gives the Lightning
checkpoint's logits. This wrapper only translates transformers' arguments (the cache, the attention mask,
left padding, ``logits_to_keep``, ``labels``) into ``features``' keywords.
``sa_lightning.register_with_transformers()`` registers both classes with ``AutoConfig`` and
``AutoModelForCausalLM`` (``register``), and ``generate`` works
through transformers' ``DynamicCache``:

- **Prefill** (the first call, empty cache) runs the variant. SA draws sigma per input from
  (``sa_seed``, layer, the row's own tokens, the draw index ``sa_sample``), as every evaluation and the patcher
  do (``attention.draws``); padding (left, as ``generate`` pads, or right) is never attended and never changes a
  row's sigma. A model trained with a fixed sigma (``permutation: deterministic``, or fixed-σ SA) draws the one it
  trained with, from its ``seed`` (``Transformer.fixed``), whatever ``sa_mode`` and ``sa_seed`` say.
  ``eval.lm.SALM`` evaluates a checkpoint through this class.
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
from .transformer import Transformer


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
    def draws(self, rows: list[list[int]], n: int, sample: int = 0) -> list[torch.Tensor] | None:
        """Per layer, draw number ``sample`` (σ, hash seeds) for right-padded ``rows``, from each row's tokens."""
        return self.model.row_draws(rows, n, seed=self.config.sa_seed, mode=self.config.sa_mode, sample=sample,
                                    device=self.device)

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
                sa_sample: int = 0, **kwargs) -> CausalLMOutputWithPast:
        """Logits for ``input_ids``. With an empty cache this is a prefill through the variant's kernel;
        with a filled one, the new tokens decode against it (``config.decode``). ``permutations`` (per
        layer, (B, n), right-padded rows) replaces the drawn sigma in a prefill; ``sa_sample`` picks which of a
        row's draws it runs (``eval_samples`` averages several). The KV cache comes as
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
        if past == 0:  # the prompt, through the variant
            idx, inputs, back = self._prompt(input_ids, attention_mask, cache, permutations, sa_sample)
        else:  # new tokens against the cache, at their positions in their rows
            idx, back = input_ids, None
            window = self.config.decode == "window"
            inputs = dict(positions=positions[:, -t:], cache=cache,
                          decode=self.model.decode_masks(positions, attention_mask.bool(), t, window))
        hidden = self.model.features(idx, **inputs)
        if back is not None:  # the caller's layout
            hidden = hidden.gather(1, back[:, :, None].expand_as(hidden))
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.model.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE: cache if use_cache else None})

    def _prompt(self, input_ids, attention_mask, cache, permutations, sample) -> tuple[torch.Tensor, dict, torch.Tensor]:
        """The prompt's rows rolled to right padding (what the kernels take), ``features``' keywords for them (each
        row's own draw, its length, the cache to fill in the caller's layout), and the index that rolls them back."""
        B, n = input_ids.shape
        shift = self._shifts(attention_mask)
        lengths = attention_mask.bool().sum(1)
        cols = (torch.arange(n, device=input_ids.device)[None, :] + shift[:, None]) % n  # left pads -> the end
        back = (torch.arange(n, device=input_ids.device)[None, :] - shift[:, None]) % n
        idx = input_ids.gather(1, cols)
        if permutations is None:
            rows = [idx[b, :int(lengths[b])].tolist() for b in range(B)]
            permutations = self.draws(rows, n, sample)
        inputs = dict(perms=permutations, lengths=lengths if bool((lengths < n).any()) else None,
                      cache=None if cache is None else _CallerLayout(cache, back))
        return idx, inputs, back


class _CallerLayout:
    """A KV cache seen through rolled rows: the keys of right-padded rows are stored in the caller's layout (left
    pads stay left), the one that ``attention_mask`` and every later call index."""

    def __init__(self, cache: Cache, back: torch.Tensor):
        self.cache, self.back = cache, back

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int):
        unroll = self.back[:, None, :, None].expand_as(k)
        return self.cache.update(k.gather(2, unroll), v.gather(2, unroll), layer)


def register() -> None:
    """Makes ``AutoModelForCausalLM`` build the folders ``cli.py export`` writes
    (``sa_lightning.register_with_transformers`` and ``models.sources``' loaders call it)."""
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    AutoModelForCausalLM.register(SATransformerConfig, SATransformerForCausalLM, exist_ok=True)
