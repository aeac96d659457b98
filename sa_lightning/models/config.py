"""Model configuration: one dataclass, named presets, and the checks that run before anything is built."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from ..attention import AttentionSpec, get_variant

PERMUTATION_MODES = ("stochastic", "fixed")
BACKBONES = ("transformer++", "qwen3")


@dataclass
class ModelConfig:
    """The decoder-only Transformer++ of the paper's Appendix B.

    ``d_ff`` defaults to floor(2.67 d) (2734 at d=1024). ``n_kv_head`` defaults to ``n_head`` (the
    paper's fused d -> 3d QKV); a smaller value gives GQA. ``permutation="stochastic"`` draws a fresh
    permutation per layer on every training step from ``seed``; ``"fixed"`` keeps one per layer.
    ``backbone="qwen3"`` builds a Hugging Face ``Qwen3ForCausalLM`` of the same size instead, run through
    the same registry by the patcher (no output gate; sa_swa is the union of both masks), which exports
    with ``save_pretrained``. ``init_from`` (a local folder or Hub id) starts it from pretrained weights
    for continued pre-training; its sizes must match this config.
    """

    vocab_size: int = 32000
    n_layer: int = 24
    n_head: int = 16
    n_kv_head: int | None = None
    d_model: int = 1024
    d_ff: int | None = None
    max_seq_len: int = 2048
    variant: str = "sa_swa"
    window: int = 256
    moba_block_size: int = 64
    moba_top_k: int = 2
    backend: str = "auto"
    permutation: str = "stochastic"
    seed: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    backbone: str = "transformer++"
    init_from: str | None = None

    def __post_init__(self):
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
        if self.permutation not in PERMUTATION_MODES:
            raise ValueError(f"model permutation must be one of {', '.join(PERMUTATION_MODES)}, got {self.permutation!r}.")
        if self.backbone not in BACKBONES:
            raise ValueError(f"model backbone must be one of {', '.join(BACKBONES)}, got {self.backbone!r}.")
        if self.init_from is not None and self.backbone != "qwen3":
            raise ValueError("model init_from (continued pre-training from a Hugging Face folder) needs backbone: qwen3.")
        self.attention_spec()  # unknown variant, window < 1, bad MoBA block: fail here, before any build

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def attention_spec(self) -> AttentionSpec:
        return AttentionSpec(self.variant, window=self.window, block_size=self.moba_block_size,
                             top_k=self.moba_top_k, backend=self.backend)

    @property
    def paths(self) -> tuple[str, ...]:
        """Gate names. Single-path variants share the name "attn" so their checkpoints load into each other."""
        paths = get_variant(self.variant).paths
        return paths if len(paths) > 1 else ("attn",)

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}.")
        return replace(PRESETS[name], **overrides)

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelConfig] = {
    # smoke tests: builds and steps in milliseconds
    "debug": ModelConfig(vocab_size=256, n_layer=2, n_head=2, d_model=32, max_seq_len=64, window=8, moba_block_size=8),
    # the embedded default: a few minutes of CPU training
    "tiny": ModelConfig(vocab_size=4096, n_layer=4, n_head=4, d_model=128, max_seq_len=256, window=32, moba_block_size=32),
    # the paper: 24 x 1024, 16 heads, w=256, vocab 32000 -> 360.2M (single path), 385.4M (sa_swa)
    "360m": ModelConfig(),
}
