"""Lightning glue: the LightningModule, its schedule and callbacks."""
from .callbacks import TokenThroughput
from .module import LitLM
from .schedule import warmup_cosine

__all__ = ["LitLM", "TokenThroughput", "warmup_cosine"]
