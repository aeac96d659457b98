"""Model configuration: one dataclass holding the one attention config, named presets, and the checks
that run before anything is built."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from ..attention import AttentionSpec, get_variant
from ..attention.variants import SA_SWA
from ..data.tokenizer import EMBEDDED_VOCAB

#: one word per idea with the evaluation's ``sa_mode`` (``attention.draws.SA_MODES``); ``fixed`` is the old name of
#: ``deterministic``, still read from configs and checkpoints
PERMUTATION_MODES = ("stochastic", "deterministic")
_OLD_PERMUTATION_NAMES = {"fixed": "deterministic"}
BACKBONES = ("transformer++", "qwen3")


@dataclass
class ModelConfig:
    """The decoder-only Transformer++ of the paper's Appendix B.

    ``d_ff`` defaults to floor(2.67 d) (2734 at d=1024). ``n_kv_head`` defaults to ``n_head`` (the
    paper's fused d -> 3d QKV); a smaller value gives GQA. ``permutation="stochastic"`` draws a fresh
    permutation per layer on every training step from ``seed``; ``"deterministic"`` keeps one per layer (the
    draw of every variant that draws: σ, the random control's hash seeds).
    ``attention`` is the registry's ``AttentionSpec`` (variant, window, MoBA's block_size and top_k,
    backend, sink): ``--model.arch.attention.variant sa`` swaps the variant.
    ``backbone="qwen3"`` builds a Hugging Face ``Qwen3ForCausalLM`` of the same size instead, run through
    the same registry by the patcher, which exports with ``save_pretrained``; it has no output gate, so
    the gated ``sa_swa`` is refused there (``sa_swa_union`` is one softmax over both masks). ``init_from`` (a local folder or Hub id) starts it from pretrained weights
    for continued pre-training; its sizes must match this config.
    ``token_shift`` adds to each token's embedding a learnt map of the previous token's, x_t + W x_{t-1} (a causal
    convolution of width 2: RWKV's token shift, the short convolution of H3 and Zoology's MQAR models). It is off in
    the paper's model. On, every position holds its predecessor's identity before any attention, which associative
    recall's key matching needs (the value's position must know its key): synthetic MQAR then learns at micro
    scale, where plain attention stays at the 1/pairs plateau (docs/results.md, Tables 12, 12b). It is the same for
    every variant (it precedes the attention and is never permuted), so a comparison of variants stays a comparison
    of their long-range routes. Training and scoring only: decoding against a KV cache refuses it.

    Args:
        vocab_size: the vocabulary's size (the CLI links it from the data's tokenizer).
        n_layer: transformer blocks.
        n_head: attention heads per layer.
        n_kv_head: key and value heads (fewer than n_head: GQA); null: n_head.
        d_model: the hidden size d.
        d_ff: the feed-forward inner size; null: floor(2.67 d).
        max_seq_len: the longest sequence the model takes, in tokens.
        attention: the attention variant and its settings (the registry's ``AttentionSpec``).
        permutation: ``stochastic`` (a fresh draw per layer on every training step) or ``deterministic`` (one draw
            per layer).
        seed: the draws' seed (the CLI links it from ``seed_everything``).
        rope_theta: RoPE's base.
        norm_eps: RMSNorm's epsilon.
        init_std: the standard deviation of the initial weights.
        backbone: ``transformer++`` (this package's model) or ``qwen3`` (a Hugging Face Qwen3 of the same size).
        init_from: with backbone qwen3, a local folder or Hub id of pretrained weights to continue from; null:
            fresh weights.
        token_shift: add a learnt map of the previous token's embedding to each token's (off in the paper).
    """

    vocab_size: int = 32000
    n_layer: int = 24
    n_head: int = 16
    n_kv_head: int | None = None
    d_model: int = 1024
    d_ff: int | None = None
    max_seq_len: int = 2048
    attention: AttentionSpec = field(default_factory=AttentionSpec)
    permutation: str = "stochastic"
    seed: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    backbone: str = "transformer++"
    init_from: str | None = None
    token_shift: bool = False

    def __post_init__(self):
        if isinstance(self.attention, dict):
            self.attention = AttentionSpec(**self.attention)
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.d_ff is None:
            self.d_ff = math.floor(2.67 * self.d_model)
        for name in ("vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "max_seq_len"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"model {name} must be >= 1, got {getattr(self, name)}.")
        if self.d_model % self.n_head:
            raise ValueError(f"model d_model={self.d_model} must be divisible by n_head={self.n_head}.")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"model n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head}.")
        if (self.d_model // self.n_head) % 2:
            raise ValueError(f"model head dim d_model/n_head={self.d_model // self.n_head} must be even for RoPE.")
        if self.permutation in _OLD_PERMUTATION_NAMES:
            object.__setattr__(self, "permutation", _OLD_PERMUTATION_NAMES[self.permutation])
        if self.permutation not in PERMUTATION_MODES:
            raise ValueError(f"model permutation must be one of {', '.join(PERMUTATION_MODES)}, got {self.permutation!r}.")
        if self.backbone not in BACKBONES:
            raise ValueError(f"model backbone must be one of {', '.join(BACKBONES)}, got {self.backbone!r}.")
        if self.init_from is not None and self.backbone != "qwen3":
            raise ValueError("model init_from (continued pre-training from a Hugging Face folder) needs backbone: qwen3.")
        if self.token_shift and self.backbone != "transformer++":
            raise ValueError("model token_shift is the Transformer++ backbone's; a Hugging Face qwen3 has none.")
        variant = get_variant(self.attention.variant)
        if self.backbone == "qwen3" and variant.gated:
            raise ValueError(f"model backbone qwen3 has no output gate, so the gated {variant.name} cannot run on it; "
                             f"use attention.variant {variant.training_free_twin} (one softmax over both masks) or "
                             "backbone transformer++.")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def paths(self) -> tuple[str, ...]:
        """Gate names. Single-path variants share the name "attn" so their checkpoints load into each other."""
        paths = get_variant(self.attention.variant).paths
        return paths if len(paths) > 1 else ("attn",)

    @classmethod
    def from_dict(cls, arch: dict) -> "ModelConfig":
        """From a saved ``arch`` (a checkpoint's hyper_parameters), flat pre-``attention`` layouts included."""
        return cls(**upgrade_arch(arch))

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        """A preset; ``overrides`` may name ``ModelConfig`` or ``AttentionSpec`` fields (``variant="sa"``)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}.")
        preset = PRESETS[name].to_dict()
        # d_ff and n_kv_head follow d_model and n_head (as when a YAML leaves them out) unless the preset sets
        # them apart: from_name("tiny", d_model=64, n_head=2) gets floor(2.67 * 64) and 2, not tiny's own
        if preset["d_ff"] == math.floor(2.67 * preset["d_model"]):
            preset["d_ff"] = None
        if preset["n_kv_head"] == preset["n_head"]:
            preset["n_kv_head"] = None
        arch = upgrade_arch({**preset, **overrides})
        return cls(**arch)

    def to_dict(self) -> dict:
        return asdict(self)


ATTENTION_FIELDS = tuple(f.name for f in fields(AttentionSpec))
#: the flat names of attention settings before ``ModelConfig.attention`` (checkpoints keep them)
LEGACY_ATTENTION = {"variant": "variant", "window": "window", "moba_block_size": "block_size",
                    "moba_top_k": "top_k", "backend": "backend", "sink": "sink", "block_size": "block_size",
                    "top_k": "top_k"}


def upgrade_arch(arch: dict) -> dict:
    """``arch`` with every flat attention key (``variant``, ``window``, ``moba_block_size`` ...) moved into
    ``arch["attention"]``: the layout of checkpoints written before ``ModelConfig.attention``."""
    arch = dict(arch)
    attention = arch.get("attention") or {}
    attention = dict(attention) if isinstance(attention, dict) else asdict(attention)
    for old, new in LEGACY_ATTENTION.items():
        if old in arch:
            attention[new] = arch.pop(old)
    if attention:
        arch["attention"] = attention
    return arch


#: the model presets. ``tiny`` and ``360m`` are the models of the shipped run configs (``configs/tiny.yaml``
#: and ``configs/pretrain_360m.yaml``, ``model.arch`` with the vocabulary their data links in); they are Python
#: so that an installed copy, which has no configs/, has them too. tests/test_presets.py checks that the YAMLs
#: agree with them field by field.
PRESETS: dict[str, ModelConfig] = {
    # smoke tests: builds and steps in milliseconds (no run config ships this size)
    "debug": ModelConfig(vocab_size=256, n_layer=2, n_head=2, d_model=32, max_seq_len=64,
                         attention=AttentionSpec(window=8, block_size=8)),
    # the embedded default: the shipped Shakespeare tokenizer's vocabulary
    "tiny": ModelConfig(vocab_size=EMBEDDED_VOCAB, n_layer=4, n_head=4, d_model=128, max_seq_len=256,
                        attention=AttentionSpec(SA_SWA.name, window=32, block_size=16, top_k=2),
                        permutation="stochastic"),
    # the paper's 360M (Appendix B): the Mistral tokenizer's 32000 tokens, d_ff = floor(2.67 d) = 2734
    "360m": ModelConfig(vocab_size=32000, n_layer=24, n_head=16, d_model=1024, max_seq_len=2048,
                        attention=AttentionSpec(SA_SWA.name, window=256, block_size=128, top_k=2),
                        permutation="stochastic"),
}
