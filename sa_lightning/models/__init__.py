"""Models: the paper's Transformer++, a Hugging Face (Qwen3) backbone, and their configuration presets."""
from .config import PRESETS, ModelConfig
from .transformer import Transformer


def build_model(cfg: ModelConfig):
    """The network ``cfg.backbone`` names: the Transformer++ or the Qwen3 backbone."""
    if cfg.backbone == "qwen3":
        from .hf_backbone import HFBackbone

        return HFBackbone(cfg)
    return Transformer(cfg)


__all__ = ["ModelConfig", "PRESETS", "Transformer", "build_model"]
