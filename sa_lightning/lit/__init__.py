"""Lightning glue: the LightningModule, its schedule and callbacks."""
from .callbacks import CheckpointAtEnd, ExportHF, SaveOnSignal, TokenThroughput
from .checkpoint import AtomicCheckpointIO
from .module import LitLM
from .schedule import warmup_cosine

__all__ = ["AtomicCheckpointIO", "CheckpointAtEnd", "ExportHF", "LitLM", "SaveOnSignal", "TokenThroughput", "warmup_cosine"]
