"""The LightningDataModule: documents -> tokens -> packed blocks -> exactly sharded batches.

Two modes (``data.mode``):

- ``stream`` (the default for ``hub`` and ``files`` sources): training reads, tokenizes and packs the
  source on the fly inside the DataLoader workers (``stream.TokenStream``); the first batch comes in
  seconds whatever the corpus size. The loader's state goes into every checkpoint, per rank and worker.
- ``cache`` (the default for the ``embedded`` corpus): the source is tokenized once into a token cache
  that every rank memory-maps (``packing.PackedBlocks``). ``python cli.py prepare`` writes it with
  several processes; a multi-rank ``fit`` never tokenizes inside Lightning's setup barrier.

Either way each batch is a LongTensor (B, seq_len + 1): inputs are ``[:, :-1]``, targets ``[:, 1:]``.
The validation set is the first ``val_blocks`` blocks of the validation source, cached once; each rank
scores a disjoint slice, and the loss is reduced over ranks by the model's metric.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import fields
from pathlib import Path

import lightning as L
from torch.utils.data import DataLoader

from .corpus import SourceConfig, open_stream, resolve_files, source_identity
from .packing import PackedBlocks, cache_folder, prepare_tokens
from .repeats import RepeatedBlocks, RepeatMix
from .resume import check_stream_resume, stream_identity
from .sampler import BlockSampler, EpochOffsetSampler, fit_position
from .stats import unigram_perplexity
from .stream import SplitPlan, StreamLoader, TokenStream, peek_tokens
from .tokenizer import load_tokenizer
from ..utils.cache import data_cache

DEFAULT_CACHE = data_cache()
MODES = ("auto", "stream", "cache")
UNIGRAM_SAMPLE_TOKENS = 2_000_000  # stream mode: the unigram baseline's statistics come from the stream's head
log = logging.getLogger(__name__)


def resolve_mode(mode: str, train: SourceConfig) -> str:
    if mode not in MODES:
        raise ValueError(f"data mode must be one of {', '.join(MODES)}, got {mode!r}.")
    if mode == "auto":
        return "cache" if train.kind == "embedded" else "stream"
    return mode


def _process_seconds() -> float:
    """Seconds since this process started (the user's ``fit``), not since this module was imported."""
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # psutil missing or no /proc: count from import
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()
_BUILT: list[bool] = []  # [True] once a data module was built in this process: a later one's run began later


class LMDataModule(L.LightningDataModule):
    """Language-model data for ``cli.py fit``.

    Args:
        train: where training documents come from (see ``SourceConfig``).
        val: where validation documents come from.
        tokenizer: ``embedded`` (shipped, vocab 4096), a Hugging Face name (``mistralai/Mistral-7B-v0.1``)
            or a local path.
        seq_len: tokens per training sequence (blocks hold seq_len + 1).
        batch_size: sequences per device and step.
        val_blocks: size of the fixed validation set, in blocks (split over ranks).
        mode: ``stream``, ``cache`` or ``auto`` (stream for hub and files sources, cache for embedded).
        max_train_tokens: cache mode: stop tokenizing the training source after this many tokens.
        shuffle: shuffle the training data in a deterministic per-epoch order (cache: blocks; stream: shards and
            documents).
        seed: the seed of that order (the CLI links it from ``seed_everything``).
        shuffle_buffer: stream mode: documents in each worker's shuffle buffer.
        read_batch: stream mode: documents read and tokenized per call in a worker.
        num_workers: DataLoader worker processes (stream mode: the tokenizing readers per rank).
        cache_dir: where packed tokens are cached (``$SA_LIGHTNING_CACHE`` overrides the default).
        progress: show a progress bar while the cache is built.
        repeats: ``{length, gap[, count, alphabet, low, copies, gap_max]}``: random-token segments planted in every
            block and repeated ``gap`` tokens later (``copies`` times, the last one scored; with ``gap_max`` each
            segment's gap drawn from gap to gap_max; ``data.repeats.RepeatMix``):
            long-range information inside ordinary text. Validation batches then carry ``repeat``, the mask of the
            targets that only the copies predict, and ``planted``, the other targets the planting made (``study
            pretrain`` scores the copies apart and the text without either). Cache mode only.
    """

    def __init__(
        self,
        train: SourceConfig = SourceConfig("embedded", split="train"),
        val: SourceConfig = SourceConfig("embedded", split="validation"),
        tokenizer: str = "embedded",
        seq_len: int = 256,
        batch_size: int = 16,
        val_blocks: int = 64,
        mode: str = "auto",
        max_train_tokens: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 1024,
        read_batch: int = 64,
        num_workers: int = 0,
        cache_dir: str = DEFAULT_CACHE,
        progress: bool = True,
        repeats: dict | None = None,
    ):
        super().__init__()
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("val_blocks", val_blocks),
                            ("read_batch", read_batch)):
            if value < 1:
                raise ValueError(f"data {name} must be >= 1, got {value}.")
        for name, value in (("num_workers", num_workers), ("shuffle_buffer", shuffle_buffer)):
            if value < 0:
                raise ValueError(f"data {name} must be >= 0, got {value}.")
        self.mode = resolve_mode(mode, train)
        if self.mode == "stream" and max_train_tokens is not None:
            raise ValueError("data max_train_tokens caps the token cache of cache mode; in stream mode the run stops "
                             "at model.max_tokens (or trainer.max_steps), so drop max_train_tokens or set data.mode: cache.")
        for source in (train, val):
            if source.kind == "files":
                resolve_files(source.paths)  # a missing or unreadable path fails now, not mid-prepare
        self.train_source, self.val_source = train, val
        self.tokenizer_name = tokenizer
        self.tokenizer = load_tokenizer(tokenizer)
        self.repeats = None
        if repeats:
            if self.mode == "stream":
                raise ValueError("data repeats plants segments in the cached blocks; set data.mode: cache.")
            known = [f.name for f in fields(RepeatMix)]
            unknown = set(repeats) - set(known)
            if unknown:
                raise ValueError(f"data repeats takes {', '.join(known)}, got {', '.join(sorted(unknown))}.")
            self.repeats = RepeatMix(**repeats)
            self.repeats.check(seq_len, len(self.tokenizer))
        self.seq_len, self.batch_size, self.val_blocks = seq_len, batch_size, val_blocks
        self.max_train_tokens, self.shuffle, self.seed = max_train_tokens, shuffle, seed
        self.shuffle_buffer, self.read_batch = shuffle_buffer, read_batch
        self.num_workers, self.cache_dir, self.progress = num_workers, cache_dir, progress
        self.train_set = self.val_set = self.unigram_sample = None
        self.train_stream = None  # stream mode: the source's datasets.IterableDataset
        self.train_sampler: BlockSampler | None = None
        self._train_loader: StreamLoader | None = None
        self._first_batch_logged = False
        # a process that trains one run counts from its own start (imports included); a later run in the same
        # process (a study's worker trains cell after cell) from when its data module was built
        self._built = time.perf_counter() if _BUILT else None
        _BUILT[:] = [True]
        self._resume: dict | None = None
        self._source_identity: dict | None = None  # stream mode: the training files as this run found them

    @property
    def vocab_size(self) -> int:
        """Linked into ``model.arch.vocab_size`` by the CLI."""
        return len(self.tokenizer)

    # ---- caches -------------------------------------------------------------------------------
    def _prepare(self, source: SourceConfig, max_tokens: int | None, num_proc: int = 1, overwrite: bool = False,
                 rebuild_stale: bool = False) -> Path:
        return prepare_tokens(source, self.tokenizer, self.tokenizer_name, self.cache_dir, max_tokens,
                              progress=self.progress, num_proc=num_proc, overwrite=overwrite,
                              rebuild_stale=rebuild_stale)

    def _unigram_sample(self, overwrite: bool = False) -> Path:
        """Stream mode: the first 2M tokens of the training source, for the unigram baseline only. It rebuilds
        itself when the source changed (a few seconds), instead of refusing: nothing else depends on it."""
        return self._prepare(self.train_source, UNIGRAM_SAMPLE_TOKENS, overwrite=overwrite, rebuild_stale=True)

    @property
    def _val_tokens(self) -> int:
        return self.val_blocks * (self.seq_len + 1)

    def train_cache(self) -> Path:
        """Cache mode: the training cache folder (it may not exist yet)."""
        return cache_folder(self.train_source, self.tokenizer, self.tokenizer_name, self.cache_dir,
                            self.max_train_tokens)

    def prepare(self, num_proc: int = 1, overwrite: bool = False) -> dict[str, Path]:
        """``cli.py prepare``: write the training cache with ``num_proc`` processes, and the validation set
        (stream mode: the unigram sample too, so that ``--overwrite`` rebuilds every cache ``fit`` reads)."""
        folders = {"train": self._prepare(self.train_source, self.max_train_tokens, num_proc, overwrite),
                   "validation": self._prepare(self.val_source, self._val_tokens, 1, overwrite)}
        if self.mode == "stream":
            folders["unigram sample"] = self._unigram_sample(overwrite)
        return folders

    def check_launch(self, world_size: int) -> None:
        """Called on every rank before ``fit``: a multi-rank cache-mode run never tokenizes in the barrier."""
        if self.mode == "cache" and world_size > 1 and not (self.train_cache() / "meta.json").is_file():
            raise ValueError(
                f"cache mode on {world_size} ranks needs the token cache of {self.train_source.describe()}, which is "
                f"not in {self.cache_dir}; write it first with `python cli.py prepare --config <this config>` "
                "(or use data.mode: stream).")

    def prepare_data(self) -> None:
        """Small, cached work only (the validation blocks; in stream mode the unigram sample). Cache mode on
        one rank also tokenizes the training source here, as a single-process run may."""
        self._prepare(self.val_source, self._val_tokens)
        if self.mode == "stream":
            self._unigram_sample()
        else:
            self._prepare(self.train_source, self.max_train_tokens)

    def setup(self, stage: str | None = None) -> None:
        if self.val_set is not None:
            return
        self.val_set = PackedBlocks(self._prepare(self.val_source, self._val_tokens), self.seq_len,
                                    max_blocks=self.val_blocks)
        if self.mode == "stream":
            self.train_stream = open_stream(self.train_source)
            peek_tokens(self.train_stream, self.train_source, self.tokenizer, self.seq_len + 1)
            self._source_identity = source_identity(self.train_source, self.train_stream)
            self.unigram_sample = PackedBlocks(self._unigram_sample(), self.seq_len)
            rank, world = self._rank_world()
            if rank == 0:
                plan = SplitPlan(self.train_stream.num_shards, world * max(self.num_workers, 1))
                print(plan.describe(world, max(self.num_workers, 1)), flush=True)
        else:
            self.train_set = PackedBlocks(self._prepare(self.train_source, self.max_train_tokens), self.seq_len)
        for name, ds in (("train", self.train_set), ("validation", self.val_set)):
            if ds is not None and len(ds) == 0:
                raise ValueError(
                    f"the {name} data ({ds.meta['num_tokens']} tokens) is shorter than one block of "
                    f"seq_len + 1 = {self.seq_len + 1} tokens; use more data or a shorter seq_len."
                )

    def unigram_perplexity(self, max_tokens: int = 50_000_000) -> float:
        """The context-free baseline for ``val/ppl``: unigram stats of (up to) the first 50M training tokens
        (stream mode: the first 2M), scored on the validation blocks."""
        train = (self.train_set or self.unigram_sample).tokens()[:max_tokens]
        val = self.val_set.tokens()[: len(self.val_set) * self.val_set.block]
        return unigram_perplexity(train, val, self.vocab_size)

    # ---- loaders ------------------------------------------------------------------------------
    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, dataset, sampler) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          pin_memory=False, persistent_workers=self.num_workers > 0, drop_last=False)

    def train_dataloader(self):
        rank, world = self._rank_world()
        if self.mode == "stream":
            if self.num_workers > 0:  # the workers are the parallelism; forked tokenizer threads would deadlock
                os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            stream = TokenStream(self.train_stream, self.train_source, self.tokenizer, self.seq_len, rank=rank,
                                 world_size=world, seed=self.seed, shuffle_buffer=self.shuffle_buffer if self.shuffle else 0,
                                 read_batch=self.read_batch)
            self._train_loader = StreamLoader(stream, batch_size=self.batch_size, num_workers=self.num_workers,
                                              rank=rank, world_size=world)
            if self._resume is not None:
                self._train_loader.load_stream_state(self._resume["stream"])
            return self._train_loader
        self.train_sampler = BlockSampler(len(self.train_set), rank=rank, world_size=world,
                                          shuffle=self.shuffle, seed=self.seed)
        if self._resume is not None:
            self.train_sampler.resume(self._resume["epoch"], self._resume["consumed_blocks"])
        if self.repeats is None:
            return self._loader(self.train_set, self.train_sampler)
        blocks = RepeatedBlocks(self.train_set, self.repeats, self.vocab_size, self.seed + 1, labeled=False)
        return self._loader(blocks, EpochOffsetSampler(self.train_sampler))  # segments from (epoch, block)

    def val_dataloader(self) -> DataLoader:
        """Rank r scores validation blocks r, r + W, ...: disjoint slices whose union is the whole set."""
        rank, world = self._rank_world()
        blocks = self.val_set if self.repeats is None else \
            RepeatedBlocks(self.val_set, self.repeats, self.vocab_size, 0, labeled=True)
        return self._loader(blocks, list(range(rank, len(self.val_set), world)))

    def test_dataloader(self) -> DataLoader:
        """``cli.py test`` scores the held-out split (the zero-shot tasks come from ``ZeroShotEval``)."""
        return self.val_dataloader()

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        """Runs when a training step takes its batch (after Lightning's one-batch prefetch): the stream's
        checkpointed state follows the batches really used."""
        trainer = self.trainer
        if trainer is not None and trainer.training:
            if self._train_loader is not None:
                self._train_loader.mark_used()
            if not self._first_batch_logged:
                self._first_batch_logged = True
                if trainer.is_global_zero:
                    since = _process_seconds() if self._built is None else time.perf_counter() - self._built
                    print(f"data: first training batch {since:.1f} s after start ({self.mode} mode)", flush=True)
        return batch

    # ---- checkpoint state -----------------------------------------------------------------------
    def stream_identity(self) -> dict:
        """Stream mode: the settings and source files a saved stream position belongs to (see ``resume.py``)."""
        if self._source_identity is None:  # setup records it; a state loaded without setup reads it now
            self._source_identity = source_identity(self.train_source, self.train_stream)
        _, world = self._rank_world()
        return stream_identity(batch_size=self.batch_size, world_size=world, num_workers=self.num_workers,
                               seq_len=self.seq_len, seed=self.seed, source=self._source_identity)

    def _check_stream_resume(self, state: dict) -> None:
        """``resume.check_stream_resume`` on every rank; a refusal on any rank (a node whose copy of the files
        differs) is raised on all of them, so that no rank waits for the others at the next collective."""
        rank, world = self._rank_world()
        say = (lambda line: print(line, flush=True)) if rank == 0 else (lambda line: None)
        try:
            check_stream_resume(state, self.stream_identity(), say=say)
            problem = None
        except ValueError as err:
            problem = str(err)
        import torch.distributed as dist

        if world > 1 and dist.is_available() and dist.is_initialized():
            problems = [None] * world
            dist.all_gather_object(problems, problem)
            problem = next((p for p in problems if p), None)
        if problem:
            raise ValueError(problem)

    def _fitting(self) -> bool:
        """Whether the trainer fits (validate and test restore this state too, but never read the stream)."""
        fn = getattr(getattr(self.trainer, "state", None), "fn", None)
        return fn is None or fn == "fit"

    def state_dict(self) -> dict:
        """Cache mode: batches this rank finished in the current epoch (identical on every rank), as blocks.
        Stream mode: every rank's readers, as of the last batch used (``StreamLoader.stream_state``)."""
        if self.trainer is None:
            return {}
        state = {"mode": self.mode, "batch_size": self.batch_size, "tokenizer": self.tokenizer_name,
                 "vocab_size": self.vocab_size}
        if self.mode == "cache":
            epoch, consumed = fit_position(self.trainer, self.batch_size)
            state.update(epoch=epoch, consumed_blocks=consumed)
        elif self._train_loader is not None:
            state["stream"] = self._train_loader.stream_state()
            state["stream_identity"] = self.stream_identity()
        return state

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if state.get("vocab_size") not in (None, self.vocab_size):
            raise ValueError(
                f"the checkpoint was trained with tokenizer {state.get('tokenizer')!r} (vocab {state['vocab_size']}), "
                f"but data.tokenizer {self.tokenizer_name!r} has vocab {self.vocab_size}; resume with the same tokenizer."
            )
        saved = state.get("mode", "cache")
        if saved != self.mode:
            raise ValueError(f"the checkpoint was trained in data.mode {saved!r} but this run uses {self.mode!r}; "
                             f"resume with data.mode: {saved}, since the two modes order the data differently.")
        if self.mode == "stream":
            if "stream" in state and self._fitting():  # before any loader, worker or training step exists
                self._check_stream_resume(state)
            self._resume = {"stream": state["stream"]} if "stream" in state else None
        else:
            self._resume = {"epoch": state["epoch"], "consumed_blocks": state["consumed_blocks"]}
            # Lightning warns that a plain DataLoader cannot resume mid-epoch; this one can, through the sampler
            warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch ended")
