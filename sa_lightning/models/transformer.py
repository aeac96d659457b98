"""The Transformer++ of the paper's Appendix B, readable in one sitting.

Tied embeddings (with ``token_shift``, each plus a learnt map of its predecessor's), pre-norm RMSNorm,
a fused bias-free QKV projection, RoPE on original positions,
the attention output gate sigmoid(W_g Y) * Y (two of them for SA+SWA), and a SwiGLU MLP. The
attention itself comes from the variant registry; this file never knows how a variant computes.

The block loop lives here only. Training, evaluation and the transformers wrapper (``hf_model``) all run
``Transformer.features``; the wrapper adds what generation needs through its keywords: each token's
position, a KV cache that a prefill fills, and the cached keys a decoded token reads (``decode_masks``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import GatedPaths, get_variant
from ..attention.draws import layer_draws, stream_seed
from ..attention.slots import from_slots, slot_positions, to_slots
from .config import ModelConfig


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (B, 1, n, head_dim) for the (B, n) positions of the tokens (the rotate-half layout of HF
    Llama/Qwen); B may be 1 for positions shared by the batch."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions[:, None, :, None].float() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, n, hd) by the tables of its own (original) positions."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def _attend(variant, q, k, v, spec, perm, lengths) -> tuple:
    """The variant's kernel. ``perm`` and ``lengths`` were drawn valid or checked once by ``Transformer.features``,
    so no layer reads their values back (``validate=False``: no host sync per layer).

    In a compiled model (``model.compile: true``) a kernel that the compiler can trace (``Variant.traceable``:
    FlexAttention) is part of the model's graph; any other runs eagerly between graphs (``_attend_eagerly``)."""
    if torch.compiler.is_compiling() and variant.traceable(spec, q, lengths):
        return variant(q, k, v, spec, perm, lengths, validate=False)
    return _attend_eagerly(variant, q, k, v, spec, perm, lengths)


@torch.compiler.disable
def _attend_eagerly(variant, q, k, v, spec, perm, lengths) -> tuple:
    """The variant's kernel, kept out of a compiled graph: the banded O(n*w) kernels hold custom autograd
    functions, and traced, their masks fail Inductor's C++ build (torch 2.13); SDPA (the dense path) is the same
    fused kernel either way. The projections, RoPE, gates, norms and MLP around it still compile."""
    return variant(q, k, v, spec, perm, lengths, validate=False)


def _attend_in_slots(variant, q, k, v, spec, order, lengths):
    """``Variant.in_slots`` inside a compiled graph where the kernel traces (FlexAttention), else eagerly."""
    if torch.compiler.is_compiling() and variant.traceable(spec, q, lengths):
        return variant.in_slots(q, k, v, spec, order, lengths)
    return _in_slots_eagerly(variant, q, k, v, spec, order, lengths)


@torch.compiler.disable
def _in_slots_eagerly(variant, q, k, v, spec, order, lengths):
    return variant.in_slots(q, k, v, spec, order, lengths)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim, bias=False)
        self.gate = GatedPaths(cfg.d_model, cfg.paths)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.spec = cfg.attention.at_depth(cfg.n_layer)  # the controls' patterns for this model's layers
        self.variant = get_variant(cfg.attention.variant)

    def forward(self, x, cos, sin, perm=None, lengths=None, *, cache=None, layer: int = 0, decode=None):
        """The variant's kernel over x, whose keys and values go into ``cache`` (as ``layer``) when one is given;
        with ``decode`` (per path, the cached keys each token reads, ``Transformer.decode_masks``), x's tokens
        are added to the cache and attend it instead: SDPA, since no kernel reads a cache."""
        if perm is not None and cache is None and decode is None and self.variant.runs_in_slots(
                self.spec, x, self.head_dim, lengths):
            return self.in_slots(x, cos, sin, perm, lengths)
        q, k, v = self.heads(x, cos, sin)
        if decode is not None:
            k, v = cache.update(k, v, layer)
            return self.output(tuple(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                                     for mask in decode))
        if cache is not None:
            cache.update(k, v, layer)
        return self.output(_attend(self.variant, q, k, v, self.spec, perm, lengths))

    def in_slots(self, x, cos, sin, perm, lengths=None):
        """The layer in its variant's slot order (``attention.slots``): x's rows gathered once, projected with
        RoPE at their original positions, attended, gated and projected in slot order, and put back once."""
        order = self.variant.slot_order(self.spec, perm)
        q, k, v = self.heads(to_slots(x, order), *slot_positions(cos, sin, order))
        y = _attend_in_slots(self.variant, q, k, v, self.spec, order, lengths)
        return from_slots(self.output((y,)), order)

    def heads(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, n, hd) and k, v (B, Hkv, n, hd), rotated by RoPE at their original positions."""
        B, n, _ = x.shape
        sizes = (self.n_head * self.head_dim, self.n_kv_head * self.head_dim, self.n_kv_head * self.head_dim)
        q, k, v = self.qkv(x).split(sizes, dim=-1)
        q = q.view(B, n, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, n, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, n, self.n_kv_head, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v  # before any permutation

    def output(self, paths: tuple) -> torch.Tensor:
        """The gated, projected sum of the variant's paths, each (B, H, n, hd)."""
        B, _, n, _ = paths[0].shape
        return self.proj(self.gate(*[y.transpose(1, 2).reshape(B, n, -1) for y in paths]))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x, cos, sin, perm=None, lengths=None, *, cache=None, layer: int = 0, decode=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, perm, lengths, cache=cache, layer=layer, decode=decode)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.shift = nn.Linear(cfg.d_model, cfg.d_model, bias=False) if cfg.token_shift else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight  # tied
        self.variant = get_variant(cfg.attention.variant)
        self._eval_calls = 0
        self._compiled_blocks = None  # ``compile``
        self.reset_parameters()

    def reset_parameters(self):
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # residual-branch outputs are scaled down with depth (GPT-2 / nanoGPT)
                scale = 1 / math.sqrt(2 * self.cfg.n_layer) if name.endswith(("proj.weight", "down.weight")) else 1.0
                nn.init.normal_(p, mean=0.0, std=std * scale)

    def num_parameters(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # tied weights count once
        return n - self.embed.weight.numel() if exclude_embedding else n

    @torch.compiler.disable  # seeded torch.Generators cannot be traced: draws are made eagerly, then passed in
    def draws(self, n: int, stream: int | None, device, lengths: torch.Tensor | None = None
              ) -> list[torch.Tensor | None]:
        """Each layer's draw (σ for SA, the hash seeds of the random control; None for a variant that draws
        nothing), shared across heads and the batch; with ``lengths`` (a right-padded batch), one per row that
        keeps its padding in place, as the kernels require (``attention.draws.layer_draws``).

        A ``fixed`` model: its one draw per layer and length, from the seed. ``stochastic``: fresh per ``stream``
        (the training step counter), so a run is reproducible and a resumed run draws what the uninterrupted one did.
        """
        if not self.variant.draws:
            return [None] * len(self.blocks)
        if self.fixed:
            return layer_draws(self.variant, self.cfg.attention, n, range(len(self.blocks)), seed=self.cfg.seed,
                               fixed=True, device=device, lengths=lengths)
        if stream is None:
            stream, self._eval_calls = -1 - self._eval_calls, self._eval_calls + 1
        return layer_draws(self.variant, self.cfg.attention, n, range(len(self.blocks)),
                           seed=stream_seed(self.cfg.seed, stream), device=device, lengths=lengths)

    @property
    def fixed(self) -> bool:
        """It trained with one draw per layer (``permutation: deterministic``, or a ``frozen`` variant such as fixed-σ
        SA), which every evaluation, export and generation keeps (``attention.draws.fixed_draws``)."""
        return self.variant.draws and (self.cfg.permutation == "deterministic" or self.variant.frozen)

    def row_draws(self, rows: list, n: int, *, seed: int, mode: str, device, sample: int = 0,
                  keys: list | None = None) -> list[torch.Tensor] | None:
        """Each layer's draw for right-padded ``rows`` from each row's own tokens (evaluation and generation, the
        paper's §3.3: ``attention.draws.layer_draws`` with ``rows``); None for a variant that draws nothing. A
        ``fixed`` model draws the σ it trained with, whatever ``seed``, ``mode`` and ``sample`` say."""
        if not self.variant.draws:
            return None
        if self.fixed:
            return layer_draws(self.variant, self.cfg.attention, n, range(len(self.blocks)), seed=self.cfg.seed,
                               rows=rows, fixed=True, device=device)
        return layer_draws(self.variant, self.cfg.attention, n, range(len(self.blocks)), seed=seed, rows=rows,
                           mode=mode, sample=sample, keys=keys, device=device)

    def decode_masks(self, positions: torch.Tensor, valid: torch.Tensor, t: int, window: bool
                     ) -> tuple[torch.Tensor, ...]:
        """Per path, the cached keys each of the last ``t`` tokens reads, (B, 1, t, S) bool, from every cached
        token's position in its row and whether it is a token (``positions``, ``valid``: (B, S)): each key of the
        row up to the token's position; with ``window``, for the variant's local paths, only the keys at most
        w - 1 positions back, plus the sink keys."""
        spec, query, key = self.cfg.attention, positions[:, -t:, None], positions[:, None, :]
        seen = valid[:, None, :] & (key <= query)
        near = seen & ((query - key < spec.window) | (key < spec.sink))
        return tuple((near if window and name in self.variant.local_paths else seen)[:, None]
                     for name in self.variant.paths)

    def forward(self, idx: torch.Tensor, **inputs) -> torch.Tensor:
        """Logits (B, n, vocab) for token ids (B, n); the keywords are ``features``'."""
        return self.lm_head(self.features(idx, **inputs))

    def features(self, idx: torch.Tensor, *, perm_stream: int | None = None, perms=None,
                 lengths: torch.Tensor | None = None, positions: torch.Tensor | None = None, cache=None,
                 decode: tuple[torch.Tensor, ...] | None = None, compiled: bool = True) -> torch.Tensor:
        """The final normed hidden states (B, n, d_model): ``forward`` without the LM head, for callers
        that need logits at a few positions only (scoring continuations). ``perms`` overrides the per-layer
        draws (σ, hash seeds).

        ``lengths`` (B,) marks a right-padded batch: row b's tokens from lengths[b] on are padding and
        are never attended to; the drawn permutations then keep each row's padding in place, and given
        ``perms`` must too (``sample_permutation(lengths=...)``).

        Generation: ``positions`` (B, n) are the tokens' RoPE positions (default 0..n-1); ``cache`` is a
        transformers KV cache (``update(k, v, layer)``), filled by a prefill; ``decode`` (``decode_masks``)
        makes the tokens decode against it instead of running the variant (nothing is drawn).

        ``compiled=False`` runs the eager stack of a compiled model (``compile``), for forward hooks, which a
        compiled graph does not run.
        """
        n = idx.shape[1]
        if decode is not None and self.shift is not None:
            raise ValueError("model token_shift mixes in each token's predecessor, which a KV cache does not keep: "
                             "decoding against a cache is not supported for it (score whole sequences instead).")
        if n > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {n} exceeds the model's max_seq_len={self.cfg.max_seq_len}.")
        if positions is None:
            positions = torch.arange(n, device=idx.device)[None]
        if lengths is not None or perms is not None:  # a caller's: checked here once, never per layer
            perms, lengths = self.variant.check_inputs(perms, lengths, idx.shape[0], n, idx.device)
        if perms is None:  # valid by construction
            perms = [None] * len(self.blocks) if decode is not None else self.draws(n, perm_stream, idx.device, lengths)
        blocks = self._compiled_blocks if compiled and self._compiled_blocks is not None else self.blocks
        return self.stack(idx, positions, perms, lengths, cache=cache, decode=decode, blocks=blocks)

    def stack(self, idx: torch.Tensor, positions: torch.Tensor, perms: list, lengths: torch.Tensor | None = None, *,
              cache=None, decode=None, blocks=None) -> torch.Tensor:
        """The embedding, the blocks (``blocks``: the compiled ones, ``compile``) and the final norm on inputs
        already drawn and checked (``features``)."""
        cos, sin = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed(idx)
        if self.shift is not None:  # x_t + W x_{t-1}: the first token's predecessor is zero
            x = x + self.shift(F.pad(x, (0, 0, 1, 0))[:, :-1])
        for layer, (block, perm) in enumerate(zip(self.blocks if blocks is None else blocks, perms)):
            # ``layer`` only names a cache's slot: a constant elsewhere, so one compiled block serves every layer
            x = block(x, cos, sin, perm, lengths, cache=cache, layer=layer if cache is not None else 0, decode=decode)
        return self.norm(x)

    def compile(self, *args, **kwargs) -> None:
        """Compile the blocks in place (``model.compile: true``; ``torch.compile``'s arguments), one by one: the
        blocks share their code, so Dynamo traces one block and every layer reuses its graph (a 24-layer model
        compiles about as fast as one layer; the H200 took 75-79 s to compile the whole 360M stack as one graph).
        The draws and the checks of ``features`` stay eager before it (seeded generators cannot be traced), and
        each block is one graph where its kernel is traceable (``Variant.traceable``: FlexAttention), with the
        draws passed in as tensors; parameter names and checkpoints stay as without compile."""
        self._compiled_blocks = [torch.compile(block, *args, **kwargs) for block in self.blocks]
