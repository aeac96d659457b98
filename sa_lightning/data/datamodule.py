"""The LightningDataModule: documents -> tokens -> packed blocks -> exactly sharded batches.

``prepare_data`` (local rank 0) streams the source once into a token cache; ``setup`` memory-maps it
on every rank. Each batch is a LongTensor (B, seq_len + 1): inputs are ``[:, :-1]``, targets
``[:, 1:]``. The validation set is the first ``val_blocks`` blocks of the validation split, in
order, the same on every rank. ``state_dict`` records how many batches this epoch has consumed, so a
resumed run continues with the next unseen block.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import lightning as L
from torch.utils.data import DataLoader

from .corpus import SourceConfig, resolve_files
from .packing import PackedBlocks, prepare_tokens
from .sampler import BlockSampler
from .stats import unigram_perplexity
from .tokenizer import load_tokenizer

DEFAULT_CACHE = os.environ.get("SA_LIGHTNING_CACHE", "~/.cache/sa_lightning/data")


class LMDataModule(L.LightningDataModule):
    """Language-model data for ``cli.py fit``.

    Args:
        train: where training documents come from (see ``SourceConfig``).
        val: where validation documents come from.
        tokenizer: ``embedded`` (shipped, vocab 4096), a Hugging Face name (``mistralai/Mistral-7B-v0.1``)
            or a local path.
        seq_len: tokens per training sequence (blocks hold seq_len + 1).
        batch_size: sequences per device and step.
        val_blocks: size of the fixed validation set, in blocks.
        max_train_tokens: stop tokenizing the training source after this many tokens (streams from huge hubs).
        shuffle, seed: the deterministic per-epoch block order.
        num_workers: DataLoader worker processes.
        cache_dir: where packed tokens are cached (``$SA_LIGHTNING_CACHE`` overrides the default).
    """

    def __init__(
        self,
        train: SourceConfig = SourceConfig("embedded", split="train"),
        val: SourceConfig = SourceConfig("embedded", split="validation"),
        tokenizer: str = "embedded",
        seq_len: int = 256,
        batch_size: int = 16,
        val_blocks: int = 64,
        max_train_tokens: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        num_workers: int = 0,
        cache_dir: str = DEFAULT_CACHE,
        progress: bool = True,
    ):
        super().__init__()
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("val_blocks", val_blocks)):
            if value < 1:
                raise ValueError(f"data {name} must be >= 1, got {value}.")
        for source in (train, val):
            if source.kind == "files":
                resolve_files(source.paths)  # a missing or unreadable path fails now, not mid-prepare
        self.train_source, self.val_source = train, val
        self.tokenizer_name = tokenizer
        self.tokenizer = load_tokenizer(tokenizer)
        self.seq_len, self.batch_size, self.val_blocks = seq_len, batch_size, val_blocks
        self.max_train_tokens, self.shuffle, self.seed = max_train_tokens, shuffle, seed
        self.num_workers, self.cache_dir, self.progress = num_workers, cache_dir, progress
        self.train_set = self.val_set = None
        self.train_sampler: BlockSampler | None = None
        self._resume: dict | None = None

    @property
    def vocab_size(self) -> int:
        """Linked into ``model.arch.vocab_size`` by the CLI."""
        return len(self.tokenizer)

    def _folder(self, source: SourceConfig, max_tokens: int | None) -> Path:
        return prepare_tokens(source, self.tokenizer, self.tokenizer_name, self.cache_dir, max_tokens, progress=self.progress)

    def prepare_data(self) -> None:
        self._folder(self.train_source, self.max_train_tokens)
        self._folder(self.val_source, None)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set = PackedBlocks(self._folder(self.train_source, self.max_train_tokens), self.seq_len)
            self.val_set = PackedBlocks(self._folder(self.val_source, None), self.seq_len, max_blocks=self.val_blocks)
            for name, ds in (("train", self.train_set), ("validation", self.val_set)):
                if len(ds) == 0:
                    raise ValueError(
                        f"the {name} data ({ds.meta['num_tokens']} tokens) is shorter than one block of "
                        f"seq_len + 1 = {self.seq_len + 1} tokens; use more data or a shorter seq_len."
                    )

    def unigram_perplexity(self, max_tokens: int = 50_000_000) -> float:
        """The context-free baseline for ``val/ppl``: unigram stats of (up to) the first 50M training tokens,
        scored on the validation blocks."""
        train = self.train_set.tokens()[:max_tokens]
        val = self.val_set.tokens()[: len(self.val_set) * self.val_set.block]
        return unigram_perplexity(train, val, self.vocab_size)

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, dataset, sampler) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          pin_memory=False, persistent_workers=self.num_workers > 0, drop_last=False)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        self.train_sampler = BlockSampler(len(self.train_set), rank=rank, world_size=world,
                                          shuffle=self.shuffle, seed=self.seed)
        if self._resume is not None:
            self.train_sampler.resume(self._resume["epoch"], self._resume["consumed_blocks"])
        return self._loader(self.train_set, self.train_sampler)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, BlockSampler(len(self.val_set), shuffle=False))

    def test_dataloader(self) -> DataLoader:
        """``cli.py test`` scores the held-out split (the zero-shot tasks come from ``ZeroShotEval``)."""
        return self.val_dataloader()

    def state_dict(self) -> dict:
        """Batches this rank finished in the current epoch (identical on every rank), as blocks."""
        if self.trainer is None:
            return {}
        loop = self.trainer.fit_loop
        # "processed" already counts a batch whose on_train_batch_end is saving this checkpoint
        done = loop.epoch_loop.batch_progress.current.processed
        return {"epoch": loop.epoch_progress.current.processed, "consumed_blocks": done * self.batch_size,
                "batch_size": self.batch_size, "tokenizer": self.tokenizer_name, "vocab_size": self.vocab_size}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if state.get("vocab_size") not in (None, self.vocab_size):
            raise ValueError(
                f"the checkpoint was trained with tokenizer {state.get('tokenizer')!r} (vocab {state['vocab_size']}), "
                f"but data.tokenizer {self.tokenizer_name!r} has vocab {self.vocab_size}; resume with the same tokenizer."
            )
        self._resume = {"epoch": state["epoch"], "consumed_blocks": state["consumed_blocks"]}
        # Lightning warns that a plain DataLoader cannot resume mid-epoch; this one can, through the sampler
        warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
