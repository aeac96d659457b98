"""``SATransformerConfig``: the Transformer++'s ``ModelConfig`` as a transformers config (``model_type:
sa_transformer``), plus how inference runs. The model is ``models.hf_model``; this module imports only
transformers' config machinery, so that registering it with ``AutoConfig`` stays cheap."""
from __future__ import annotations

from dataclasses import asdict, fields

from transformers import PreTrainedConfig

from ..attention import VARIANTS, AttentionSpec, get_variant
from ..attention.draws import SA_MODES
from .config import ModelConfig

MODEL_TYPE = "sa_transformer"
DECODE = ("dense", "window")
#: the ModelConfig fields a folder's config keeps under their transformers names
RENAMED = {"d_model": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
           "n_kv_head": "num_key_value_heads", "d_ff": "intermediate_size", "max_seq_len": "max_position_embeddings",
           "norm_eps": "rms_norm_eps", "init_std": "initializer_range"}


class SATransformerConfig(PreTrainedConfig):
    """A ``ModelConfig`` under transformers' names, plus how inference runs: ``decode`` (dense | window),
    ``sa_mode`` (stochastic | deterministic sigma per input) and ``sa_seed``, for a model trained stochastically: one
    trained with a fixed sigma keeps it (its ``permutation`` and ``seed``)."""

    model_type = MODEL_TYPE
    keys_to_ignore_at_inference = ["cache", "past_key_values"]  # the KV cache: transformers >= 5.24 and older

    vocab_size: int = 32000
    hidden_size: int = 1024
    intermediate_size: int | None = None
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 2048
    attention: dict | None = None
    permutation: str = "stochastic"
    seed: int = 0
    sa_rope_theta: float = 10000.0
    token_shift: bool = False
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True
    use_cache: bool = True
    decode: str = "dense"
    sa_mode: str = "stochastic"
    sa_seed: int = 0

    def __post_init__(self, **kwargs):
        self.attention = asdict(AttentionSpec(**(self.attention or {})))
        super().__post_init__(**kwargs)
        check_decode(self.attention["variant"], self.decode)
        if self.sa_mode not in SA_MODES:
            raise ValueError(f"sa_mode must be one of {', '.join(SA_MODES)}, got {self.sa_mode!r}.")

    @classmethod
    def from_model_config(cls, cfg: ModelConfig, **inference) -> "SATransformerConfig":
        if cfg.backbone != "transformer++":
            raise ValueError("SATransformerConfig is the Transformer++; a backbone: qwen3 model exports as a plain "
                             "Qwen3 folder (HFBackbone.save_pretrained).")
        arch = cfg.to_dict()
        for name in ("backbone", "init_from"):
            arch.pop(name)
        arch["sa_rope_theta"] = arch.pop("rope_theta")
        return cls(**{RENAMED.get(k, k): v for k, v in arch.items()}, **inference)

    def to_model_config(self) -> ModelConfig:
        """Every ``ModelConfig`` field back (the backbone's own aside), so that a field added there cannot be dropped
        on the way through a folder (a model exported without its token shift scored as another model)."""
        arch = {f.name: getattr(self, RENAMED.get(f.name, f.name)) for f in fields(ModelConfig)
                if f.name not in ("backbone", "init_from", "rope_theta")}
        return ModelConfig(**arch, rope_theta=self.sa_rope_theta)


def check_decode(variant: str, decode: str) -> None:
    if decode not in DECODE:
        raise ValueError(f"decode must be one of {', '.join(DECODE)}, got {decode!r}.")
    if decode == "window" and not get_variant(variant).local_paths:
        local = [name for name in VARIANTS if VARIANTS[name].local_paths]
        raise ValueError(f"decode: window reads the last w keys of a local window, and {variant} has none "
                         f"(variants with one: {', '.join(local)}); use decode: dense.")


def register() -> None:
    """Makes ``AutoConfig`` read the folders ``cli.py export`` writes (``sa_lightning.register_with_transformers``
    and ``models.sources``' loaders call it)."""
    from transformers.models.auto.configuration_auto import AutoConfig

    AutoConfig.register(MODEL_TYPE, SATransformerConfig, exist_ok=True)
