"""Patch a Hugging Face causal LM so that its prefill runs an attention variant from the registry.

Registration goes through transformers' ``AttentionInterface`` (the attention itself) **and**
``AttentionMaskInterface``: for an implementation name unknown to the mask interface, transformers
builds no mask at all and padding would be lost. Our mask function hands the attention the 2-D
padding mask (B, kv_len) instead of an n x n one.

- Prefill (q_len == kv_len) runs the O(n*w) kernels of ``sa_lightning.attention``. Each row's valid
  tokens are moved to the front (left or right padding alike), SA permutes only them, and no pad is
  ever read, so a row gives what it gives alone.
- Decode and cached continuations (q_len < kv_len) attend densely over the KV cache, as the model
  natively does (its own sliding window, if any, included).
- RoPE has already been applied by the model on its own positions; GQA heads go to the kernels
  unrepeated (query head h reads kv head h // num_key_value_groups).
- SA is stochastic by default, as in the paper (§3.3): each row draws its own sigma per layer from
  (seed, layer, the row's own tokens, the draw index), through ``attention.draws.layer_draws``, the same
  function the Transformer++ uses (the random control draws its hash seeds the same way). A forward pre-hook on the
  base model reads ``input_ids``, the padding mask and the draw index ``sa_sample`` (a keyword of the model's
  forward, 0 by default, that transformers hands down; ``eval_samples`` averages several) once per forward; a rerun
  reproduces every sigma, and batching or padding never changes it.
  ``sa_mode="deterministic"`` fixes one sigma per (seed, layer, length) instead.
- ``sink=k`` (beyond the paper; 0 by default) also shows every query the first k tokens of its row in the
  swa, sa and sa_swa modes, as StreamingLLM's attention sinks; positions count the row's valid tokens.
- The spec is the registry's ``AttentionSpec`` plus what inference adds (``PatchSpec``: ``seed``,
  ``sa_mode``), and its variant is a registry name: ``sa_swa_union`` is training-free SA+SWA, one softmax
  over both masks. The gated ``sa_swa`` needs trained output gates, which a Hugging Face model lacks, so it
  is refused in one sentence.
- A patched model's state (its spec, and each row's sigma key for the forward under way) is one object
  held as an attribute by the model and every submodule, so the attention function reads it from the
  module it is called with; two patched models never share anything.
- Inside ``counting_keys()``, every prefill adds to ``BUDGET`` the keys its masks let each valid query read
  (and the queries): the equal-budget axis of the sweep. Outside it nothing is counted, so a plain patched
  model (a benchmark, the Qwen3 backbone in training) pays nothing. Decoding is dense in every mode and
  is never counted.
"""
from __future__ import annotations

import contextlib
import difflib
import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial

import torch
import torch.nn.functional as F

from ..attention import AttentionSpec, get_variant, variant_names
from ..attention.variants import SA
from ..attention.draws import SA_MODES, layer_draws, row_key
from ..attention.permutation import gather_tokens, invert_permutation

NAME = "sa_lightning"
#: the attribute that holds a patched model's ``_Patched`` state, on the model and on each of its submodules
STATE = "_sa_lightning"
#: how many attention calls took each path; tests read it to check that decoding stays dense
CALLS: Counter = Counter()
#: "keys" and "queries" summed over the prefill calls (all layers, valid queries) run inside ``counting_keys()``
BUDGET: Counter = Counter()
_COUNTING = [False]


@dataclass(frozen=True)
class PatchSpec(AttentionSpec):
    """The registry's ``AttentionSpec`` plus what inference adds.

    variant: a registry variant without trained gates (``variant_names(gated=False)``). window: w for the
    windowed ones (None for the others). block_size, top_k: MoBA's (effective window block_size * top_k).
    backend: as the attention core. sink: the first ``sink`` tokens of each row stay visible to every query
    (the variants that take sinks; 0: the paper). seed: SA permutations. sa_mode: ``stochastic`` (each input its own sigma, the default) or
    ``deterministic``."""

    variant: str = SA.name
    window: int | None = None
    seed: int = 0
    sa_mode: str = "stochastic"

    def __post_init__(self):
        training_free = variant_names(gated=False)
        if self.variant not in training_free:
            twin = get_variant(self.variant).training_free_twin if self.variant in variant_names(gated=True) else None
            if twin:
                raise ValueError(f"variant {self.variant!r} mixes its paths with output gates that only a model "
                                 f"trained with them has; a Hugging Face model runs it training-free as {twin!r} "
                                 "(one softmax over both masks).")
            close = difflib.get_close_matches(str(self.variant), training_free, n=2)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"unknown attention variant {self.variant!r} for a Hugging Face model; choose one of "
                             f"{', '.join(training_free)}.{hint}")
        if get_variant(self.variant).windowed and self.window is None:
            raise ValueError(f"variant {self.variant!r} needs a window >= 1, got None.")
        # the registry's checks: an unknown variant (with close matches), window, block_size, top_k, sink
        AttentionSpec(self.variant, 1 if self.window is None else self.window, self.block_size, self.top_k,
                      self.backend, self.sink, depth=self.depth)
        if self.sa_mode not in SA_MODES:
            raise ValueError(f"sa_mode must be one of {', '.join(SA_MODES)}, got {self.sa_mode!r}.")

    @classmethod
    def at_window(cls, variant: str, w_eff: int, top_k: int = 2, **kwargs) -> "PatchSpec":
        """``variant`` at the effective window ``w_eff``: its window, MoBA's block_size w_eff / top_k, or full
        attention's whole row (w_eff unused)."""
        v = get_variant(variant)
        if v.blocked:
            return cls(variant, None, max(1, w_eff // top_k), top_k, **kwargs)
        return cls(variant, w_eff if v.windowed else None, **kwargs)

    @property
    def effective_window(self) -> int | None:
        return get_variant(self.variant).effective_window(self)

    @property
    def draws(self) -> bool:
        """Its variant draws per layer and input (σ, hash seeds)."""
        return get_variant(self.variant).draws


@dataclass
class _Patched:
    """A patched model's state: its spec, the implementation it had, the pre-hook, and each row's sigma key
    for the forward pass under way (set by the base model's pre-hook, read by every layer)."""

    spec: PatchSpec
    previous: str | None
    hook: object = None
    row_keys: list | None = field(default=None, repr=False)


# ---- the two registered functions --------------------------------------------------------------
def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
    """The mask our attention receives: the (B, kv_length) bool padding mask, or None without padding."""
    if attention_mask is None:
        return None
    mask = attention_mask[:, kv_offset:kv_offset + kv_length].to(torch.bool)
    return None if bool(mask.all()) else mask


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None, **kwargs):
    """transformers' attention signature: q (B, Hq, q_len, d), k/v (B, Hkv, kv_len, d) -> ((B, q_len, Hq, d), None)."""
    state = state_of(module)
    spec = state.spec
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"a model patched by sa_lightning takes a 2-D padding mask (batch, length); got a "
                         f"{attention_mask.dim()}-D attention_mask, which would need an n x n mask at prefill.")
    q_len, kv_len, d = query.shape[2], key.shape[2], query.shape[3]
    groups = getattr(module, "num_key_value_groups", None)
    if groups is not None and query.shape[1] != groups * key.shape[1]:
        raise ValueError(f"{type(module).__name__} has {query.shape[1]} query heads and {key.shape[1]} kv heads, which "
                         f"does not match its num_key_value_groups={groups}.")
    scale = d ** -0.5 if scaling is None else float(scaling)
    if q_len != kv_len or not get_variant(spec.variant).sparse:
        CALLS["dense"] += 1
        if q_len == kv_len and _COUNTING[0]:  # full-mode prefill: every valid query reads its causal prefix
            _count(spec, kv_len, None, None if attention_mask is None else attention_mask.sum(-1), query.shape[0])
        out = _dense(query, key, value, attention_mask, scale, sliding_window)
    else:
        CALLS["prefill"] += 1
        out = _prefill(spec, getattr(module, "layer_idx", 0) or 0, query, key, value, attention_mask, scale,
                       state.row_keys)
    return out.transpose(1, 2).contiguous(), None


def _dense(q, k, v, valid, scale, sliding_window):
    """Causal attention of the q_len newest tokens over all kv_len keys, minus padding (decode, full mode)."""
    B, Hq, q_len, _ = q.shape
    kv_len = k.shape[2]
    if valid is None and sliding_window is None and q_len in (1, kv_len):
        return F.scaled_dot_product_attention(q, k, v, is_causal=q_len > 1, scale=scale,
                                              enable_gqa=Hq != k.shape[1])
    q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device).view(-1, 1)
    k_pos = torch.arange(kv_len, device=q.device).view(1, -1)
    mask = (k_pos <= q_pos).view(1, 1, q_len, kv_len)
    if sliding_window is not None:
        mask = mask & (q_pos - k_pos < sliding_window).view(1, 1, q_len, kv_len)
    if valid is not None:
        mask = mask & valid.view(B, 1, 1, kv_len)
    mask = mask | ~mask.any(-1, keepdim=True)  # a pad query that sees nothing reads anything: finite, discarded
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=Hq != k.shape[1])


def _prefill(spec: PatchSpec, layer: int, q, k, v, valid, scale, keys: list[tuple] | None = None):
    B, _, n, d = q.shape
    order = lengths = None
    if valid is not None:  # valid tokens first, in their order; padding after (left or right alike)
        order = torch.sort((~valid).to(torch.int8), dim=-1, stable=True).indices
        q, k, v = (gather_tokens(t, order) for t in (q, k, v))
        lengths = valid.sum(-1)
    if scale != d ** -0.5:  # the kernels take the default 1/sqrt(d)
        q = q * (scale * math.sqrt(d))
    variant = get_variant(spec.variant)
    perm = None
    if variant.draws:
        rows = lengths.tolist() if lengths is not None else [n] * B
        if spec.sa_mode == "stochastic" and (keys is None or len(keys) != B):
            raise RuntimeError(f"stochastic {variant.label} found no token keys for this batch: the patched model's "
                               "base model must be called with input_ids or inputs_embeds (its pre-hook reads them).")
        (perm,) = layer_draws(variant, spec, n, [layer], seed=spec.seed, rows=rows, mode=spec.sa_mode,
                              keys=keys if spec.sa_mode == "stochastic" else None, device=q.device)
    (y,) = variant(q, k, v, spec, perm, lengths)
    _count(spec, n, perm, lengths, B)
    if order is not None:
        y = gather_tokens(y, invert_permutation(order)) * valid.view(B, 1, n, 1).to(y.dtype)
    return y


@contextlib.contextmanager
def counting_keys():
    """``with counting_keys() as budget: model(...)``: ``budget`` (``BUDGET``, cleared on entry) then holds the
    keys and valid queries of every prefill call run inside, counted from the masks the kernels used."""
    BUDGET.clear()
    _COUNTING[0] = True
    try:
        yield BUDGET
    finally:
        _COUNTING[0] = False


def _count(spec: PatchSpec, n: int, perm, lengths, batch: int) -> None:
    """Add this call's keys and valid queries to ``BUDGET``, from the masks the kernel just used."""
    if not _COUNTING[0]:
        return
    keys, queries = get_variant(spec.variant).keys_attended(spec, n, perm=perm, lengths=lengths, batch=batch)
    BUDGET["keys"] += keys
    BUDGET["queries"] += queries


# ---- each row's identity, read once per forward --------------------------------------------------
def _keys_hook(state: _Patched, module, args, kwargs):
    """Forward pre-hook of the patched model's base model: every row's ``row_key`` from its own tokens
    (the positions its padding mask keeps, in order) and the draw index ``sa_sample``, so sigma never depends on
    padding or batch."""
    spec = state.spec
    if not spec.draws or spec.sa_mode != "stochastic":
        return None  # no sigma, or one per length: nothing to hash on this forward
    ids = kwargs.get("input_ids", args[0] if args else None)
    embeds = kwargs.get("inputs_embeds")
    mask = kwargs.get("attention_mask")
    if ids is None and embeds is None:
        state.row_keys = None
        return None
    source = ids if ids is not None else embeds
    sample = int(kwargs.get("sa_sample", 0))
    if mask is not None and mask.dim() != 2:
        mask = None  # a 4-D mask is refused by the attention itself, in one sentence
    keys = []
    for b in range(source.shape[0]):
        row = source[b] if mask is None else source[b][mask[b, -source.shape[1]:].to(torch.bool)]
        if ids is not None:
            keys.append(row_key(row.tolist(), sample))
        else:  # embeddings: their bytes identify the input (same input, same sigma)
            keys.append((sample, hashlib.blake2b(row.detach().float().cpu().numpy().tobytes(), digest_size=16).digest()))
    state.row_keys = keys
    return None


# ---- patching ------------------------------------------------------------------------------------
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, padding_mask)


def state_of(module) -> _Patched:
    """The patch state a patched model gave ``module`` (any of its submodules)."""
    state = module.__dict__.get(STATE)
    if state is None:
        raise RuntimeError(f"attn_implementation {NAME!r} is set on a model that sa_lightning did not patch; "
                           "use sa_lightning.inference.patch(model, ...).")
    return state


def spec_of(model) -> PatchSpec:
    """The spec a patched model (or any of its submodules) runs."""
    return state_of(model).spec


def _check_patchable(model) -> None:
    from transformers import PreTrainedModel

    name = type(model).__name__
    if not isinstance(model, PreTrainedModel):
        raise ValueError(f"{name} cannot be patched: it is not a Hugging Face PreTrainedModel.")
    if not getattr(model, "_supports_attention_backend", False):
        raise ValueError(f"{name} cannot be patched: its attention does not go through transformers' "
                         "AttentionInterface (the model class does not declare _supports_attention_backend).")


def patch(model, variant: str | PatchSpec = SA.name, window: int | None = None, *, block_size: int = 64,
          top_k: int = 2, seed: int = 0, backend: str = "auto", sa_mode: str = "stochastic", sink: int = 0):
    """Make ``model``'s prefill use ``variant``; returns the model. Patching again replaces the spec."""
    spec = variant if isinstance(variant, PatchSpec) else PatchSpec(variant, window, block_size, top_k, backend, sink,
                                                                    seed, sa_mode)
    _check_patchable(model)
    layers = getattr(model.config, "num_hidden_layers", None)
    if spec.depth is None and layers:  # the controls' patterns for the model's own layers, as a trained model's
        spec = spec.at_depth(layers)
    limit = getattr(model.config, "max_position_embeddings", None)
    if get_variant(spec.variant).blocked and limit and spec.effective_window > limit:
        raise ValueError(f"{get_variant(spec.variant).label}'s block_size * top_k = {spec.effective_window} does not fit the model's "
                         f"max_position_embeddings={limit}; choose a smaller block_size or top_k.")
    _register()
    state = model.__dict__.get(STATE)
    if state is None:
        state = _Patched(spec, model.config._attn_implementation)
        state.hook = model.base_model.register_forward_pre_hook(partial(_keys_hook, state), with_kwargs=True)
        for module in model.modules():  # the attention layers read it from the module they are called with
            module.__dict__[STATE] = state
    state.spec = spec
    model.set_attn_implementation(NAME)
    return model


def set_seed(model, seed: int) -> None:
    """Change a patched model's SA permutation seed in place: called every training step by the Qwen3
    backbone, so it only swaps the stored spec (no re-registration, no implementation switch)."""
    state = state_of(model)
    state.spec = replace(state.spec, seed=seed)


def unpatch(model):
    """Restore the attention implementation the model had before ``patch``."""
    state = model.__dict__.get(STATE)
    if state is None:
        return model
    model.set_attn_implementation(state.previous)
    state.hook.remove()
    for module in model.modules():
        module.__dict__.pop(STATE, None)
    return model


@contextlib.contextmanager
def patched(model, variant: str | PatchSpec = SA.name, window: int | None = None, **kwargs):
    """``with patched(model, "sa", 256): ...`` patches for the block and restores afterwards."""
    patch(model, variant, window, **kwargs)
    try:
        yield model
    finally:
        unpatch(model)
