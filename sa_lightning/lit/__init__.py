"""Lightning glue: the LightningModule, the LightningCLI, its schedule and callbacks (training, evaluation, attention maps)."""
from .callbacks import CheckpointAtEnd, ExportHF, SaveOnSignal, TokenThroughput
from .checkpoint import AtomicCheckpointIO
from .eval_callbacks import AttentionMapLogger, ZeroShotEval
from .module import LitLM
from .schedule import warmup_cosine

__all__ = ["AtomicCheckpointIO", "AttentionMapLogger", "CheckpointAtEnd", "ExportHF", "LitLM", "SaveOnSignal", "TokenThroughput", "ZeroShotEval", "warmup_cosine"]
