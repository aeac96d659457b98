"""A Hugging Face causal-LM backbone (the Qwen3 architecture) trained through the same attention registry.

The model is a plain ``Qwen3ForCausalLM`` whose attention is patched by ``models.patcher`` with the
config's own ``AttentionSpec``, so every variant runs the registry's kernels (with their backward) and the
trained model exports with ``save_pretrained`` into a folder that any transformers install loads, and that
``cli.py sweep`` can patch again. There is no output gate here: ``ModelConfig`` refuses the gated
``sa_swa`` on this backbone (``sa_swa_union`` is one softmax over both masks). It has the same interface
as ``Transformer`` for the Lightning module; the evaluator runs its patched model (``for_evaluation``).
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from ..attention import get_variant
from ..attention.draws import stream_seed
from .config import ModelConfig


def qwen3_config(cfg: ModelConfig):
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
                       num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head,
                       num_key_value_heads=cfg.n_kv_head, head_dim=cfg.head_dim, max_position_embeddings=cfg.max_seq_len,
                       rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                       rms_norm_eps=cfg.norm_eps, initializer_range=cfg.init_std, tie_word_embeddings=True,
                       use_cache=False)


class HFBackbone(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        from transformers import Qwen3ForCausalLM

        from .patcher import PatchSpec, patch

        self.cfg = cfg
        self.hf = Qwen3ForCausalLM(qwen3_config(cfg)) if cfg.init_from is None else self._pretrained(cfg)
        self.spec = PatchSpec(**asdict(cfg.attention.at_depth(cfg.n_layer)), seed=cfg.seed,
                              sa_mode=cfg.permutation)
        patch(self.hf, self.spec)
        self.variant = get_variant(self.spec.variant)

    @staticmethod
    def _pretrained(cfg: ModelConfig):
        """Continued pre-training: the weights of ``cfg.init_from``, whose sizes must match ``cfg``."""
        from transformers import AutoModelForCausalLM

        try:
            model = AutoModelForCausalLM.from_pretrained(cfg.init_from, dtype="float32")
        except OSError as err:
            raise ValueError(f"model init_from {cfg.init_from!r} cannot be loaded: it is neither a local model "
                             f"folder nor a reachable Hub repo ({str(err).splitlines()[0][:160]}).") from None
        want = qwen3_config(cfg)
        fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim")
        wrong = [f"{f}={getattr(model.config, f, None)} (config: {getattr(want, f)})" for f in fields
                 if getattr(model.config, f, None) != getattr(want, f)]
        if wrong:
            raise ValueError(f"model init_from {cfg.init_from!r} does not match model.arch: {', '.join(wrong)}; "
                             "set model.arch to the pretrained model's sizes.")
        return model

    @property
    def blocks(self) -> nn.ModuleList:
        return self.hf.model.layers

    @property
    def lm_head(self) -> nn.Module:
        return self.hf.lm_head

    def num_parameters(self, exclude_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.hf.model.embed_tokens.weight.numel() if exclude_embedding else n

    def _reseed(self, stream: int | None) -> None:
        """Stochastic mode: fresh permutations per training step (the patcher keys them by seed and layer); a frozen
        variant (fixed-σ SA) keeps its seed's, as ``permutation: deterministic`` does."""
        from .patcher import set_seed
        if self.variant.draws and not self.variant.frozen and self.cfg.permutation == "stochastic" \
                and stream is not None:
            set_seed(self.hf, stream_seed(self.cfg.seed, stream))

    def for_evaluation(self, seed: int):
        """The patched Qwen3 model as evaluation runs it: a stochastic backbone's rows draw from evaluation stream
        ``-1 - seed`` (disjoint from training's; the next training step reseeds), a deterministic one keeps the σ
        it was trained with."""
        self._reseed(-1 - seed)
        return self.hf

    def features(self, idx: torch.Tensor, *, perm_stream: int | None = None, perms=None,
                 lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states; ``perms`` is ignored (the patcher draws each row's own permutation)."""
        self._reseed(perm_stream)
        mask = None if lengths is None else (torch.arange(idx.shape[1], device=idx.device) < lengths.view(-1, 1)).long()
        return self.hf.model(input_ids=idx, attention_mask=mask, use_cache=False).last_hidden_state

    def forward(self, idx: torch.Tensor, *, perm_stream: int | None = None, perms=None,
                lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm_head(self.features(idx, perm_stream=perm_stream, perms=perms, lengths=lengths))

    def save_pretrained(self, folder: str | Path, tokenizer=None) -> Path:
        """A plain transformers folder: the model loads with ``AutoModelForCausalLM`` and no sa_lightning."""
        from .patcher import patch, unpatch

        folder = Path(folder)
        unpatch(self.hf)
        try:
            self.hf.save_pretrained(folder)
        finally:
            patch(self.hf, self.spec)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return folder
