"""Exact, deterministic, resumable sharding of packed blocks over DDP ranks.

Every epoch draws one permutation of all blocks from (seed, epoch); rank r takes positions r, r+W,
r+2W, ... of it. Ranks are therefore disjoint, every rank gets the same count (so DDP never waits on
a rank that ran dry), and only the last ``num_blocks % W`` blocks of each epoch's order are left out
(a different set each epoch). DataLoader workers receive indices from this sampler in the main
process, so they can neither repeat nor drop a block. ``skip`` resumes mid-epoch at the next unseen
block.
"""
from __future__ import annotations

import torch
from torch.utils.data import Sampler


def fit_position(trainer, batch_size: int) -> tuple[int, int]:
    """(epoch, samples this rank finished in it) of a ``fit``, for ``BlockSampler.resume``. Lightning's
    "processed" already counts a batch whose on_train_batch_end is saving the checkpoint."""
    loop = trainer.fit_loop
    return loop.epoch_progress.current.processed, loop.epoch_loop.batch_progress.current.processed * batch_size


class BlockSampler(Sampler[int]):
    def __init__(self, num_blocks: int, *, rank: int = 0, world_size: int = 1, shuffle: bool = True, seed: int = 0):
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size}).")
        if num_blocks < world_size:
            raise ValueError(
                f"the data has {num_blocks} blocks, fewer than the {world_size} ranks that must each get one; "
                "use more data or a shorter seq_len."
            )
        self.num_blocks, self.rank, self.world_size = num_blocks, rank, world_size
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0
        self._resume_epoch, self._resume_skip = 0, 0

    @property
    def per_rank(self) -> int:
        return self.num_blocks // self.world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, consumed: int) -> None:
        """Skip the first ``consumed`` indices of this rank's share in ``epoch`` (and only that epoch)."""
        self._resume_epoch, self._resume_skip = epoch, consumed

    def _skip(self) -> int:
        return self._resume_skip if self.epoch == self._resume_epoch else 0

    def order(self, epoch: int) -> torch.Tensor:
        """The global block order of ``epoch`` (the same on every rank)."""
        if not self.shuffle:
            return torch.arange(self.num_blocks)
        gen = torch.Generator().manual_seed(int(self.seed) * 100_003 + int(epoch))
        return torch.randperm(self.num_blocks, generator=gen)

    def indices(self, epoch: int) -> list[int]:
        usable = self.per_rank * self.world_size
        return self.order(epoch)[self.rank:usable:self.world_size].tolist()

    def __iter__(self):
        return iter(self.indices(self.epoch)[self._skip():])

    def __len__(self) -> int:
        return self.per_rank - self._skip()


class EpochOffsetSampler(Sampler[int]):
    """``BlockSampler``'s exact, resumable sharding of ``size`` indices, offset by ``epoch * size``: a dataset that
    draws something per item (a synthetic example, a planted repeat) draws it from (epoch, index), the same on a
    resumed run, on any number of workers."""

    def __init__(self, inner: BlockSampler):
        self.inner = inner

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    def __iter__(self):
        offset = self.inner.epoch * self.inner.num_blocks
        return (offset + i for i in self.inner)

    def __len__(self) -> int:
        return len(self.inner)
