"""Training-free inference: swap the prefill attention of Hugging Face models for SWA, SA, SA+SWA or MoBA.

The patcher itself is model code (``sa_lightning.models.patcher``, which the Qwen3 backbone also trains
through); this package runs it: the lm-eval model and the window sweeps.
"""
from ..models.patcher import PatchSpec, patch, patched, unpatch

__all__ = ["PatchSpec", "patch", "patched", "unpatch"]
