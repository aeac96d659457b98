"""Model configuration: one dataclass holding the one attention config, named presets, and the checks
that run before anything is built."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..attention import AttentionSpec, get_variant

PERMUTATION_MODES = ("stochastic", "fixed")
BACKBONES = ("transformer++", "qwen3")


@dataclass
class ModelConfig:
    """The decoder-only Transformer++ of the paper's Appendix B.

    ``d_ff`` defaults to floor(2.67 d) (2734 at d=1024). ``n_kv_head`` defaults to ``n_head`` (the
    paper's fused d -> 3d QKV); a smaller value gives GQA. ``permutation="stochastic"`` draws a fresh
    permutation per layer on every training step from ``seed``; ``"fixed"`` keeps one per layer.
    ``attention`` is the registry's ``AttentionSpec`` (variant, window, MoBA's block_size and top_k,
    backend, sink): ``--model.arch.attention.variant sa`` swaps the variant.
    ``backbone="qwen3"`` builds a Hugging Face ``Qwen3ForCausalLM`` of the same size instead, run through
    the same registry by the patcher, which exports with ``save_pretrained``; it has no output gate, so
    the gated ``sa_swa`` is refused there (``sa_swa_union`` is one softmax over both masks). ``init_from`` (a local folder or Hub id) starts it from pretrained weights
    for continued pre-training; its sizes must match this config.
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
        if self.permutation not in PERMUTATION_MODES:
            raise ValueError(f"model permutation must be one of {', '.join(PERMUTATION_MODES)}, got {self.permutation!r}.")
        if self.backbone not in BACKBONES:
            raise ValueError(f"model backbone must be one of {', '.join(BACKBONES)}, got {self.backbone!r}.")
        if self.init_from is not None and self.backbone != "qwen3":
            raise ValueError("model init_from (continued pre-training from a Hugging Face folder) needs backbone: qwen3.")
        if self.backbone == "qwen3" and self.attention.variant == "sa_swa":
            raise ValueError("model backbone qwen3 has no output gate, so the gated sa_swa cannot run on it; use "
                             "attention.variant sa_swa_union (one softmax over both masks) or backbone transformer++.")

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
        arch = PRESETS[name]() if callable(PRESETS[name]) else PRESETS[name].to_dict()
        arch = upgrade_arch({**arch, **overrides})
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


#: the shipped run configs whose ``model.arch`` is each preset: the sizes have one source, the YAML
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHIPPED = {"tiny": "tiny.yaml", "360m": "pretrain_360m.yaml"}


def _shipped_arch(name: str) -> dict:
    """``model.arch`` of the shipped config behind preset ``name``, with the vocabulary its data links in."""
    import yaml

    path = CONFIGS / SHIPPED[name]
    if not path.is_file():
        raise ValueError(f"model preset {name!r} is the model of {path}, which this install lacks; run from a "
                         "checkout of sa_lightning (pip install -e .), or pass a ModelConfig.")
    config = yaml.safe_load(path.read_text())
    arch = dict(config["model"]["arch"])
    data = config.get("data")
    if isinstance(data, dict) and data.get("tokenizer") == "embedded":
        from ..data.tokenizer import EMBEDDED_VOCAB

        arch.setdefault("vocab_size", EMBEDDED_VOCAB)
    return arch


PRESETS: dict = {
    # smoke tests: builds and steps in milliseconds (no run config ships this size)
    "debug": ModelConfig(vocab_size=256, n_layer=2, n_head=2, d_model=32, max_seq_len=64,
                         attention=AttentionSpec(window=8, block_size=8)),
    # the embedded default (configs/tiny.yaml) and the paper's 360M (configs/pretrain_360m.yaml), read from them
    "tiny": lambda: _shipped_arch("tiny"),
    "360m": lambda: _shipped_arch("360m"),
}
