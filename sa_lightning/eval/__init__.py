"""Zero-shot evaluation: the lm-eval model, the offline tasks, the Table 1 layout and the callbacks."""
from .callbacks import AttentionMapLogger, ZeroShotEval

__all__ = ["ZeroShotEval", "AttentionMapLogger"]
