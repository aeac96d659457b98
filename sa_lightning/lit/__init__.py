"""Lightning glue: the LightningModule, the LightningCLI, its schedule and callbacks (training, evaluation,
attention maps, synthetic-task accuracy). Private Lightning names are used in ``lightning_private`` only."""
from .accuracy import DistanceAccuracy
from .callbacks import CheckpointAtEnd, ExportHF, SaveOnSignal, TokenThroughput
from .checkpoint import AtomicCheckpointIO
from .eval_callbacks import AttentionMapLogger, ZeroShotEval
from .module import LitLM
from .schedule import warmup_cosine

__all__ = ["AtomicCheckpointIO", "AttentionMapLogger", "CheckpointAtEnd", "DistanceAccuracy", "ExportHF", "LitLM", "SaveOnSignal", "TokenThroughput", "ZeroShotEval", "warmup_cosine"]
