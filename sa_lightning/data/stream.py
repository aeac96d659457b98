"""Stream mode: read, split, shuffle, tokenize and pack a corpus of any size on the fly, resumably.

``datasets`` reads the source (``load_dataset(..., streaming=True)``) and splits it: first by rank with
``split_dataset_by_node``, then by DataLoader worker the same way. Each (rank, worker) pair is one
*reader*; readers get whole shards when the source has at least as many shards as readers, else every
``readers``-th document. Inside its worker a reader:

1. shuffles the shard order by (seed, epoch) (``datasets``' ``set_epoch``, the same on every reader);
2. reads ``read_batch`` documents at a time and tokenizes them in one call of the fast tokenizer;
3. shuffles documents through a seeded buffer of ``shuffle_buffer`` documents, drained at the end of
   each epoch so that no document is read twice within an epoch;
4. packs documents, joined with EOS, into blocks of ``seq_len + 1`` tokens, carrying each tail over.

The stream never ends: after the last document of an epoch the next epoch starts with a new seed, and
training stops at ``trainer.max_steps`` (from ``model.max_tokens``). Every rank therefore always has a
next batch, which DDP needs.

The state of a reader (its position in ``datasets``' stream, the buffer, the shuffle RNG and the
packer's carried tokens) is its ``state_dict``; ``StreamLoader`` (a ``StatefulDataLoader``) collects
it per worker, per rank, into every checkpoint, so that a resumed run continues with exactly the next
batch. ``datasets``' own buffered shuffle cannot do that (it restores its buffer empty), which is why
the shuffle and the packing live here.
"""
from __future__ import annotations

import logging
import warnings
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from .corpus import DataSourceError, SourceConfig, own_progress_locks, sentence, text_view, texts_of

log = logging.getLogger(__name__)
_SEED_MIX = 1_000_003


@dataclass(frozen=True)
class SplitPlan:
    """How the source's shards are dealt to ``readers`` = ranks x workers."""

    num_shards: int
    readers: int

    @property
    def strategy(self) -> str:
        return "shards" if self.num_shards >= self.readers else "examples"

    def describe(self, world_size: int, num_workers: int) -> str:
        who = f"{world_size} rank(s) x {num_workers} worker(s) = {self.readers} readers"
        if self.strategy == "shards":
            lo, hi = self.num_shards // self.readers, -(-self.num_shards // self.readers)
            each = f"{lo}" if lo == hi else f"{lo} or {hi}"
            return f"data: {self.num_shards} shards over {who}: whole shards, {each} per reader"
        return (f"data: the source has {self.num_shards} shard(s), fewer than the {who}, so it is split at "
                f"example level: every reader reads the whole stream and keeps one document in {self.readers}")


def reader_stream(base, rank: int, world_size: int, worker: int, num_workers: int, text_field: str):
    """``base`` restricted to one reader, text column only, as Arrow batches."""
    from datasets.distributed import split_dataset_by_node

    plan = SplitPlan(base.num_shards, world_size * num_workers)
    ds = split_dataset_by_node(base, rank=rank, world_size=world_size, strategy=plan.strategy)
    ds = split_dataset_by_node(ds, rank=worker, world_size=num_workers)  # reader = rank * workers + worker
    return text_view(ds, text_field)


def epoch_key(seed: int, epoch: int) -> int:
    """The non-zero key that ``datasets`` shuffles the shard order with in ``epoch`` (0 would mean unshuffled)."""
    return 1 + (int(seed) * _SEED_MIX + int(epoch)) % (2**62)


class TokenStream(IterableDataset):
    """An endless stream of ``seq_len + 1``-token blocks (int64) for one rank; see the module docstring.

    Args:
        base: the source's ``datasets.IterableDataset`` (unsplit).
        source: its ``SourceConfig`` (for the text field and messages).
        tokenizer: a fast tokenizer with ``eos_token_id``.
        rank, world_size: this process's DDP rank and the number of ranks.
        shuffle_buffer: documents held for the shuffle (0: documents keep their order; shards are still shuffled).
        read_batch: documents read and tokenized per call.
    """

    def __init__(self, base, source: SourceConfig, tokenizer, seq_len: int, *, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle_buffer: int = 1024, read_batch: int = 64):
        super().__init__()
        self.base, self.source, self.tokenizer = base, source, tokenizer
        self.block, self.rank, self.world_size, self.seed = seq_len + 1, rank, world_size, int(seed)
        self.shuffle_buffer, self.read_batch = max(int(shuffle_buffer), 0), max(int(read_batch), 1)
        self.eos = int(tokenizer.eos_token_id)
        self._resume: dict | None = None
        self._state: dict | None = None

    # ---- identity ----------------------------------------------------------------------------
    def _reader(self) -> tuple[int, int]:
        info = get_worker_info()
        return (0, 1) if info is None else (info.id, info.num_workers)

    def _identity(self) -> dict:
        worker, workers = self._reader()
        return {"rank": self.rank, "world_size": self.world_size, "worker": worker, "num_workers": workers,
                "block": self.block, "seed": self.seed, "source": self.source.describe()}

    # ---- Stateful ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue after the last yielded block: plain types and tensors only,
        so that checkpoints still load with ``weights_only=True``."""
        s = self._state
        if s is None:
            return {"identity": self._identity(), "started": False}
        buffer = s["buffer"]
        return {
            "identity": self._identity(), "started": True, "epoch": s["epoch"], "hf": s["hf"],
            "exhausted": s["exhausted"], "rng": s["rng"].bit_generator.state,
            "buffer": torch.from_numpy(np.concatenate(buffer) if buffer else np.zeros(0, np.int32)),
            "buffer_lengths": torch.tensor([len(d) for d in buffer], dtype=torch.int64),
            "carry": torch.from_numpy(s["carry"].copy()), "docs": s["docs"], "blocks": s["blocks"],
        }

    def load_state_dict(self, state: dict) -> None:
        """The last guard: ``LMDataModule.load_state_dict`` (``resume.check_stream_resume``) compares the run's
        settings and source files in the main process first, in one sentence. The source is not compared
        here by its paths, so that a copy of the same files elsewhere resumes."""
        mine, theirs = self._identity(), state.get("identity", {})
        different = {k: (theirs.get(k), v) for k, v in mine.items() if k != "source" and theirs.get(k) != v}
        if different:
            said = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(different.items()))
            raise DataSourceError(f"the checkpoint's data stream cannot continue here, because its reader differs "
                                  f"({said}); resume with the same data config, devices, num_nodes and "
                                  "data.num_workers, or start a new run without --ckpt_path.")
        self._resume = state if state.get("started") else None

    # ---- iteration ---------------------------------------------------------------------------
    def _fresh_epoch(self, epoch: int) -> dict:
        worker, workers = self._reader()
        rng = np.random.default_rng([self.seed, epoch, self.rank * workers + worker])
        return {"epoch": epoch, "hf": None, "exhausted": False, "rng": rng, "buffer": [],
                "carry": np.zeros(0, np.int64), "docs": 0, "blocks": 0}

    def _restored(self) -> dict:
        s = dict(self._resume)
        rng = np.random.default_rng()
        rng.bit_generator.state = s["rng"]
        flat, lengths = s["buffer"].numpy(), s["buffer_lengths"].tolist()
        offsets = np.cumsum([0, *lengths])
        s.update(rng=rng, buffer=[flat[a:b].astype(np.int32) for a, b in zip(offsets[:-1], offsets[1:])],
                 carry=s["carry"].numpy().astype(np.int64))
        self._resume = None
        return s

    def _batches(self, state: dict):
        """(texts, hf state after them) from this reader's part of the source, for ``state['epoch']``."""
        worker, workers = self._reader()
        ds = reader_stream(self.base, self.rank, self.world_size, worker, workers, self.source.text_field)
        ds.set_epoch(epoch_key(self.seed, state["epoch"]))
        if state["hf"] is not None:
            ds.load_state_dict(state["hf"])
        tables = ds.iter(batch_size=self.read_batch)
        while True:
            try:
                table = next(tables)
                texts = texts_of(table, self.source)
            except StopIteration:
                return
            except DataSourceError:  # already one sentence naming the file and record
                raise
            except KeyError as err:
                raise DataSourceError(err.args[0]) from err
            except Exception as err:  # decoders and remote reads raise many types
                raise DataSourceError(f"data reader {self.rank * workers + worker} (rank {self.rank}, worker {worker}) "
                                      f"could not read {self.source.describe()} ({type(err).__name__}: "
                                      f"{' '.join(str(err).split())}).") from err
            yield texts, ds.state_dict()

    def _tokenize(self, texts: list[str]) -> list[np.ndarray]:
        encodings = self.tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]  # half the bytes of each state snapshot

    def _documents(self, state: dict):
        """Token arrays of one epoch in shuffled order. Whole read batches go into the buffer before any
        document leaves it, so at every yield ``state`` (stream position + buffer) describes what is left."""
        rng, buffer = state["rng"], state["buffer"]

        def draw():
            if self.shuffle_buffer == 0:
                return buffer.pop(0)
            i = int(rng.integers(len(buffer)))
            buffer[i], buffer[-1] = buffer[-1], buffer[i]
            return buffer.pop()

        if not state["exhausted"]:
            while len(buffer) > self.shuffle_buffer:  # a resumed reader finishes its last read batch first
                yield draw()
            for texts, hf in self._batches(state):
                buffer.extend(self._tokenize(texts))
                state["hf"] = hf
                while len(buffer) > self.shuffle_buffer:
                    yield draw()
            state["exhausted"] = True
        while buffer:  # the epoch's last documents, still in random order
            yield draw()

    def _cut(self, state: dict):
        """Every whole block in the carried tokens (a long document holds several)."""
        while len(state["carry"]) >= self.block:
            block = state["carry"][: self.block]
            state["carry"], state["blocks"] = state["carry"][self.block:], state["blocks"] + 1
            yield torch.from_numpy(block.copy())

    def __iter__(self):
        state = self._restored() if self._resume is not None else self._fresh_epoch(0)
        self._state = state
        while True:
            yield from self._cut(state)
            for doc in self._documents(state):
                state["docs"] += 1
                state["carry"] = np.concatenate([state["carry"], doc, [self.eos]])
                yield from self._cut(state)
            if state["docs"] == 0:
                worker, workers = self._reader()
                raise DataSourceError(
                    f"data reader {self.rank * workers + worker} of {self.world_size * workers} (rank {self.rank}, "
                    f"worker {worker}) got no document from {self.source.describe()}: the source has fewer "
                    "documents than ranks x workers; use fewer data.num_workers or more data.")
            log.info("data: rank %d worker %d starts epoch %d", self.rank, self._reader()[0], state["epoch"] + 1)
            state = self._fresh_epoch(state["epoch"] + 1) | {"carry": state["carry"]}
            self._state = state


class StreamLoader(StatefulDataLoader):
    """The training loader of stream mode: a ``StatefulDataLoader`` over a ``TokenStream``.

    Its state (``stream_state`` / ``load_stream_state``) travels in the DataModule's checkpoint entry,
    not through Lightning's loader-state hook, for three reasons:
    - Lightning saves the loader state of rank 0 only; ``stream_state`` gathers every rank's, and
      ``load_stream_state`` picks this rank's.
    - Lightning fetches one batch ahead, so the state saved is the one recorded with the last batch the
      training step *used* (``mark_used``, called from the DataModule's transfer hook).
    - Lightning applies a checkpoint's loader state only to a loader it builds after restoring the loops,
      but ``configure_optimizers`` reading ``trainer.estimated_stepping_batches`` builds it before; the
      state would be dropped without a word. The DataModule's state is restored before any loader exists.
    ``state_dict`` / ``load_state_dict`` are therefore empty for Lightning.
    """

    def __init__(self, dataset: TokenStream, *, batch_size: int, num_workers: int, rank: int = 0,
                 world_size: int = 1, snapshot_every: int = 16):
        # a worker ships its state (the shuffle buffer: ~4 MB) with every ``snapshot_every``-th batch; a resume
        # from a batch in between regenerates the few batches since the snapshot and skips them, exactly
        with warnings.catch_warnings():  # torchdata 0.11's __init__ calls the deprecated torch.set_vital
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            super().__init__(dataset, batch_size=batch_size, num_workers=num_workers,
                             persistent_workers=num_workers > 0, snapshot_every_n_steps=snapshot_every,
                             worker_init_fn=own_progress_locks if num_workers > 0 else None)
        self.rank, self.world_size = rank, world_size
        self._pending: deque = deque()  # the state after each fetched batch not yet used, oldest first
        self._used_state: dict | None = None

    def __iter__(self):
        try:
            for batch in super().__iter__():
                self._pending.append(StatefulDataLoader.state_dict(self))
                yield batch
        except DataSourceError as err:  # from a worker its message is a traceback dump: keep the sentence
            shutdown = getattr(self._iterator, "_shutdown_workers", None)
            if shutdown is not None:  # now: left to garbage collection, joining the workers takes 5 s
                shutdown()
            raise DataSourceError(sentence(err)) from err

    def mark_used(self) -> None:
        if self._pending:
            self._used_state = self._pending.popleft()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def stream_state(self) -> dict:
        """Every rank's reader states after its last used batch (a collective: call it on every rank)."""
        local = self._used_state if self._used_state is not None else StatefulDataLoader.state_dict(self)
        ranks = [local]
        if self.world_size > 1:
            import torch.distributed as dist

            ranks = [None] * self.world_size
            dist.all_gather_object(ranks, local)
        return {"world_size": self.world_size, "ranks": ranks}

    def load_stream_state(self, state: dict) -> None:
        if state.get("world_size") != self.world_size:
            raise ValueError(
                f"the checkpoint's data stream was read by {state.get('world_size')} rank(s) but this run has "
                f"{self.world_size}; resume with the same devices and num_nodes.")
        StatefulDataLoader.load_state_dict(self, state["ranks"][self.rank])


def peek_tokens(base, source: SourceConfig, tokenizer, need: int, read_batch: int = 16) -> int:
    """Tokens in the first documents of ``base``, reading until ``need`` are found or the stream ends:
    a stream with no ``text_field``, no record or less than one block fails here, in the main process."""
    if source.text_field not in (base.column_names or [source.text_field]):
        raise KeyError(f"records of {source.describe()} have no field {source.text_field!r} "
                       f"(they have {', '.join(base.column_names)}); set text_field.")
    found = docs = 0
    try:
        for table in text_view(base, source.text_field).iter(batch_size=read_batch):
            texts = texts_of(table, source)
            found += sum(len(e.ids) + 1 for e in tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False))
            docs += len(texts)
            if found >= need:
                return found
    except (KeyError, ValueError, ConnectionError):
        raise
    except Exception as err:  # pyarrow / json decoders raise many types for a damaged file
        raise ValueError(f"data source {source.describe()} could not be read ({type(err).__name__}: {err}).") from err
    if docs == 0:
        raise ValueError(f"data source {source.describe()} is empty: it holds no document with text in "
                         f"{source.text_field!r}.")
    raise ValueError(f"data source {source.describe()} holds {found} tokens, fewer than one block of seq_len + 1 = "
                     f"{need}; use more data or a shorter seq_len.")
