"""Lightning glue: the LightningModule, its schedule and callbacks."""
from .callbacks import CheckpointAtEnd, TokenThroughput
from .module import LitLM
from .schedule import warmup_cosine

__all__ = ["CheckpointAtEnd", "LitLM", "TokenThroughput", "warmup_cosine"]
