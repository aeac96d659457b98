"""Training-free inference: swap the prefill attention of Hugging Face models for SWA, SA, SA+SWA or MoBA."""
from .patcher import MODES, PatchSpec, patch, patched, unpatch

__all__ = ["MODES", "PatchSpec", "patch", "patched", "unpatch"]
