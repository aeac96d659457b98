"""Data: document sources, the embedded corpus and tokenizer, packing, exact sharding, the DataModule."""
from .corpus import SourceConfig, documents, embedded_documents
from .datamodule import LMDataModule
from .packing import PackedBlocks, prepare_tokens
from .sampler import BlockSampler
from .synthetic import RecallTask, SyntheticDataModule
from .tokenizer import load_tokenizer

__all__ = ["SourceConfig", "documents", "embedded_documents", "LMDataModule", "PackedBlocks", "prepare_tokens",
           "BlockSampler", "load_tokenizer", "RecallTask", "SyntheticDataModule"]
