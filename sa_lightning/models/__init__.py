"""Models: the paper's Transformer++ and its configuration presets."""
from .config import PRESETS, ModelConfig
from .transformer import Transformer

__all__ = ["ModelConfig", "PRESETS", "Transformer"]
