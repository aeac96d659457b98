"""Lightning glue: the LightningModule, its schedule and callbacks."""
from .callbacks import CheckpointAtEnd, ExportHF, TokenThroughput
from .module import LitLM
from .schedule import warmup_cosine

__all__ = ["CheckpointAtEnd", "ExportHF", "LitLM", "TokenThroughput", "warmup_cosine"]
