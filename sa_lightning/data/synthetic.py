"""Synthetic recall tasks at a controlled key-query distance: where does a model's reach end?

Two tasks, generated in memory from (seed, split, epoch, index), with no files:

- ``mqar`` (multi-query associative recall): ``num_pairs`` key-value pairs planted in filler, each
  followed later in the sequence by a query: its key again. The answer is the pair's value.
- ``passkey``: one key-value pair planted in filler, queried once at the last position.

A sequence is ``seq_len + 1`` tokens (inputs ``[:-1]``, as for text). The query's key sits at input
position ``t`` and ``labels[t]`` is the answer; every other position is ignored (``labels == IGNORE``).
The answer is never written into the sequence after its query, so no later query can copy it from there. ``distance[t] = t - p``, where ``p`` is the position of the
pair's key: how far back the evidence lies. Distances are drawn bucket by bucket (a bucket at random,
then a distance in it), so every distance bucket gets the same share of queries in training and in
validation. Keys are distinct within a sequence; values may repeat; filler never uses a key or value.

MQAR has two layouts. ``scattered`` (the default, above) plants each pair and its query anywhere, at a distance
drawn bucket by bucket. ``blocked`` is Zoology's (Arora et al., 2023): the ``num_pairs`` pairs open the sequence
back to back, then the ``num_queries`` queries follow in a random order, each a key with its answer written after
it (each key is queried once, so no later query can copy a written answer), filler between them where there is
room. Distances then follow from the layout: with as many queries as pairs and no filler at n = 4 * num_pairs, they
run from 2 to n - 2, most of them long, and every fourth target is an answer.

Token ids: keys ``[0, num_keys)``, values ``[num_keys, num_keys + num_values)``, filler after them.

Filler is i.i.d. (``filler="random"``) or two interleaved counters (``filler="counters"``: each filler token is the
one two places before it plus one, modulo ``num_filler``). Predicting such filler needs the token before the
current one: a previous-token head, the first half of the circuit that matches a query's key to its pair (its
second half reads the token after the match). Random filler and an answer-only loss train no such head, and MQAR
stalls where a model finds the planted values without matching keys (about 1/pairs of the answers). With counters,
each example also carries ``aux_labels``: the filler's own next tokens where the rule holds (the token two back
and the next one unplanted filler), ``IGNORE`` elsewhere; training adds their mean loss to the answers' (validation
and accuracy score the answers alone). Measured: at L = 2, d = 64, n = 128 with 8 pairs, full attention still sat at
the 1/pairs plateau beyond SWA's field through 5000 steps (docs/results.md, Table 12): a head trained to carry which
filler token came before need not carry which key did. What does learn here is the architecture's shortcut:
``model.arch.token_shift`` (each token's embedding plus a learnt map of its predecessor's) hands every position its
predecessor's identity, and full attention then learns 8 pairs at n = 128 within a few hundred steps (Table 12b).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .sampler import BlockSampler, EpochOffsetSampler, fit_position

TASKS = ("mqar", "passkey")
FILLERS = ("random", "counters")
LAYOUTS = ("scattered", "blocked")
IGNORE = -100  # cross_entropy's ignore_index: targets that are not answers
_SPLITS = {"train": 0, "validation": 1}
_TRIES = 200  # placement attempts per query before a sequence is declared too crowded


def default_buckets(seq_len: int) -> list[int]:
    """Bucket edges 2, 16, 32, 64, ... up to seq_len: powers of two, which line up with the receptive
    fields L * (w - 1) of the usual windows."""
    edges = [2] + [2**k for k in range(4, max(5, int(math.log2(seq_len)) + 1))]
    edges = sorted({e for e in edges if e < seq_len})
    return edges + [seq_len]


def bucket_names(edges: list[int]) -> list[str]:
    """``lo-hi`` for each bucket [lo, hi] of ``edges`` (inclusive ends): ``val/acc@<name>``."""
    return [f"{lo}-{hi - 1}" for lo, hi in zip(edges[:-1], edges[1:])]


@dataclass(frozen=True)
class RecallTask:
    """What one sequence looks like. See the module docstring for the layout.

    Args:
        task: ``mqar`` or ``passkey``.
        seq_len: input length n (sequences hold n + 1 tokens).
        num_pairs: mqar: key-value pairs per sequence (passkey: always 1).
        num_queries: mqar: queries per sequence, one per distinct pair (<= num_pairs).
        num_keys, num_values, num_filler: sizes of the three disjoint token sets.
        vocab_size: the model's vocabulary (default: exactly the three sets); must hold them.
        buckets: distance bucket edges, increasing, from >= 2 to <= seq_len (default: powers of two).
        max_distance: the longest key-query distance drawn (default: the last edge - 1).
        filler: ``random`` (i.i.d.) or ``counters`` (see the module docstring: trains a previous-token head).
        layout: mqar: ``scattered`` (pairs and queries anywhere, distances drawn by bucket) or ``blocked`` (the pairs
            first, then the queries with their answers written; the module docstring).
    """

    task: str = "mqar"
    seq_len: int = 512
    num_pairs: int = 16
    num_queries: int = 16
    num_keys: int = 64
    num_values: int = 64
    num_filler: int = 16
    vocab_size: int | None = None
    buckets: list[int] | None = field(default=None, hash=False)
    max_distance: int | None = None
    filler: str = "random"
    layout: str = "scattered"

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"unknown synthetic task {self.task!r}; choose one of {', '.join(TASKS)}.")
        if self.filler not in FILLERS:
            raise ValueError(f"unknown synthetic filler {self.filler!r}; choose one of {', '.join(FILLERS)}.")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown synthetic layout {self.layout!r}; choose one of {', '.join(LAYOUTS)}.")
        if self.layout == "blocked" and self.task != "mqar":
            raise ValueError("the blocked layout is MQAR's (pairs first, then queries); passkey has one pair and "
                             "one query: use the scattered layout.")
        if self.layout == "blocked" and self.max_distance is not None:
            raise ValueError("max_distance draws scattered distances; in the blocked layout the distances follow "
                             "from num_pairs, num_queries and seq_len: leave it unset.")
        for name in ("seq_len", "num_pairs", "num_queries", "num_keys", "num_values", "num_filler"):
            if getattr(self, name) < 1:
                raise ValueError(f"synthetic {name} must be >= 1, got {getattr(self, name)}.")
        if self.seq_len < 4:
            raise ValueError(f"synthetic seq_len must be >= 4 (a pair and a query), got {self.seq_len}.")
        if self.task == "mqar" and self.num_queries > self.num_pairs:
            raise ValueError(f"mqar asks each query about its own pair, so num_queries={self.num_queries} cannot "
                             f"exceed num_pairs={self.num_pairs}.")
        if self.pairs > self.num_keys:
            raise ValueError(f"the vocabulary is too small for the key set: {self.pairs} pairs per sequence need "
                             f"{self.pairs} distinct keys but num_keys={self.num_keys}.")
        if self.vocab_size is not None and self.vocab_size < self.needed_vocab:
            raise ValueError(f"vocab_size={self.vocab_size} is too small for the key and value sets: keys, values and "
                             f"filler need {self.needed_vocab} ids ({self.num_keys} + {self.num_values} + {self.num_filler}).")
        edges = self.edges
        if any(b <= a for a, b in zip(edges[:-1], edges[1:])) or edges[0] < 2 or len(edges) < 2:
            raise ValueError(f"synthetic buckets must be at least two increasing edges starting at >= 2, got {edges}.")
        if edges[-1] > self.seq_len:
            raise ValueError(f"a distance bucket ends at {edges[-1]}, longer than seq_len={self.seq_len}: the "
                             f"evidence cannot lie before the sequence starts; use edges <= seq_len.")
        if self.max_distance is not None and not 2 <= self.max_distance <= self.seq_len - 1:
            raise ValueError(f"max_distance={self.max_distance} must lie in [2, seq_len - 1 = {self.seq_len - 1}]: a "
                             f"distance longer than seq_len has no room for its pair.")
        if self.layout == "blocked" and 2 * (self.num_pairs + self.num_queries) > self.seq_len + 1:
            raise ValueError(f"blocked mqar with {self.num_pairs} pairs and {self.num_queries} queries needs "
                             f"{2 * (self.num_pairs + self.num_queries)} tokens, more than the sequence's "
                             f"{self.seq_len + 1}; use fewer pairs or a longer sequence.")
        if self.task == "mqar" and 4 * self.num_queries + 2 * (self.num_pairs - self.num_queries) > self.seq_len:
            raise ValueError(f"mqar with {self.num_pairs} pairs and {self.num_queries} queries needs more than "
                             f"seq_len={self.seq_len} positions; use fewer pairs or a longer sequence.")

    @property
    def pairs(self) -> int:
        return 1 if self.task == "passkey" else self.num_pairs

    @property
    def queries(self) -> int:
        return 1 if self.task == "passkey" else self.num_queries

    @property
    def needed_vocab(self) -> int:
        return self.num_keys + self.num_values + self.num_filler

    @property
    def vocab(self) -> int:
        return self.vocab_size or self.needed_vocab

    @property
    def edges(self) -> list[int]:
        return list(self.buckets) if self.buckets else default_buckets(self.seq_len)

    @property
    def longest(self) -> int:
        return min(self.max_distance or self.seq_len - 1, self.edges[-1] - 1, self.seq_len - 1)

    def bucket_of(self, distance: torch.Tensor) -> torch.Tensor:
        """Bucket index of each distance (-1 outside every bucket)."""
        edges = torch.tensor(self.edges, device=distance.device)
        idx = torch.bucketize(distance, edges, right=True) - 1
        return torch.where((idx >= 0) & (idx < len(edges) - 1), idx, -1)

    # ---- generation ---------------------------------------------------------------------------
    def _draw_distance(self, rng: np.random.Generator) -> int:
        """A bucket at random among those that hold a drawable distance, then a distance in it."""
        edges = self.edges
        spans = [(lo, min(hi - 1, self.longest)) for lo, hi in zip(edges[:-1], edges[1:]) if lo <= self.longest]
        lo, hi = spans[rng.integers(len(spans))]
        return int(rng.integers(lo, hi + 1))

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """One sequence: ``tokens`` (n + 1,), ``labels`` (n,) and ``distance`` (n,) (-1 where no answer); with
        counters as filler also ``aux_labels`` (n,)."""
        n = self.seq_len
        filler0 = self.num_keys + self.num_values
        if self.filler == "counters":
            starts = rng.integers(0, self.num_filler, size=2)
            step = np.arange(n + 1)
            tokens = filler0 + (starts[step % 2] + step // 2) % self.num_filler
        else:
            tokens = rng.integers(filler0, filler0 + self.num_filler, size=n + 1)
        labels = np.full(n, IGNORE, dtype=np.int64)
        distance = np.full(n, -1, dtype=np.int64)
        keys = rng.choice(self.num_keys, size=self.pairs, replace=False)
        values = self.num_keys + rng.integers(0, self.num_values, size=self.pairs)
        place = self._blocked if self.layout == "blocked" else self._scattered
        place(rng, tokens, labels, distance, keys, values)
        example = {"tokens": tokens.astype(np.int64), "labels": labels, "distance": distance}
        if self.filler == "counters":  # target t is token t + 1, predictable from token t - 1 where both are filler
            filler = tokens >= filler0
            rule = np.zeros(n, dtype=bool)
            rule[1:] = filler[:-2] & filler[2:]
            rule &= labels == IGNORE  # a query's target is its answer
            example["aux_labels"] = np.where(rule, tokens[1:], IGNORE).astype(np.int64)
        return example

    def _scattered(self, rng: np.random.Generator, tokens: np.ndarray, labels: np.ndarray, distance: np.ndarray,
                   keys: np.ndarray, values: np.ndarray) -> None:
        """The default layout, in place: each queried pair and its query at a distance drawn by bucket, then each
        unqueried pair anywhere free."""
        used = np.zeros(self.seq_len + 1, dtype=bool)
        for i in range(self.pairs):
            if i < self.queries:
                t, p = self._place_query(rng, used)
                tokens[t] = keys[i]  # the answer is a label only: no later query can copy it from here
                labels[t], distance[t] = values[i], t - p
                used[t:t + 2] = True
            else:  # an unqueried pair: a distractor anywhere free
                p = self._free_pair(rng, used)
            tokens[p], tokens[p + 1] = keys[i], values[i]
            used[p:p + 2] = True

    def _blocked(self, rng: np.random.Generator, tokens: np.ndarray, labels: np.ndarray, distance: np.ndarray,
                 keys: np.ndarray, values: np.ndarray) -> None:
        """Zoology's layout, in place: pair i at 2i, 2i + 1; then the queries, in a random order, each a key and
        its written answer, at random 2-token slots among the filler after the pairs."""
        p = self.pairs
        tokens[0:2 * p:2], tokens[1:2 * p:2] = keys, values
        asked = rng.permutation(p)[:self.queries]
        rest = self.seq_len + 1 - 2 * p  # tokens after the pairs: queries of two tokens each, filler in the gaps
        slots = np.sort(rng.choice(rest - self.queries, size=self.queries, replace=False))
        for j, (i, slot) in enumerate(zip(asked, slots)):
            t = 2 * p + int(slot) + j  # each earlier query takes one token more than its slot
            tokens[t], tokens[t + 1] = keys[i], values[i]
            labels[t], distance[t] = values[i], t - 2 * i

    def _place_query(self, rng: np.random.Generator, used: np.ndarray) -> tuple[int, int]:
        """(query position t, pair position p = t - d) with all four slots free."""
        n = self.seq_len
        for _ in range(_TRIES):
            d = self._draw_distance(rng)
            t = n - 1 if self.task == "passkey" else int(rng.integers(d, n))
            p = t - d
            if p >= 0 and not used[[p, p + 1, t, t + 1]].any():
                return t, p
        raise ValueError(f"could not place {self.queries} queries in seq_len={n} after {_TRIES} tries each; use "
                         "fewer pairs or a longer sequence.")

    def _free_pair(self, rng: np.random.Generator, used: np.ndarray) -> int:
        free = np.flatnonzero(~used[:-1] & ~used[1:])
        free = free[free < self.seq_len - 1]
        if len(free) == 0:
            raise ValueError(f"no room left for {self.pairs} pairs in seq_len={self.seq_len}; use fewer pairs.")
        return int(rng.choice(free))

    def example(self, seed: int, split: str, index: int) -> dict[str, torch.Tensor]:
        """The sequence of (seed, split, index), the same on every machine and in every process."""
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), _SPLITS[split], int(index)]))
        return {k: torch.from_numpy(v) for k, v in self.sample(rng).items()}


class RecallDataset(Dataset):
    """Index -> sequence. Training indices run on across epochs (``epoch * size + i``), so each epoch
    draws fresh sequences while a given (seed, epoch, index) always gives the same one."""

    def __init__(self, task: RecallTask, seed: int, split: str):
        self.task, self.seed, self.split = task, seed, split

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.task.example(self.seed, self.split, index)


class SyntheticDataModule(L.LightningDataModule):
    """Synthetic recall data for ``cli.py fit`` (``configs/synthetic/*.yaml``): in memory, seeded, and
    sharded exactly over ranks like ``LMDataModule``. Batches are dicts of ``tokens`` (B, n + 1),
    ``labels`` and ``distance`` (B, n); ``LitLM`` trains on the answer positions only, and the
    ``DistanceAccuracy`` callback logs ``val/acc`` and ``val/acc@<bucket>``.

    Args: the ``RecallTask`` fields, and
        batch_size: sequences per device and step.
        train_examples: sequences per training epoch (fresh ones each epoch).
        val_examples: the fixed validation set (split over ranks).
        seed: linked from ``seed_everything``.
        num_workers: DataLoader worker processes.
        filler: ``random`` or ``counters`` (the module docstring).
        layout: ``scattered`` or ``blocked`` (the module docstring).
    """

    def __init__(self, task: str = "mqar", seq_len: int = 512, num_pairs: int = 16, num_queries: int = 16,
                 num_keys: int = 64, num_values: int = 64, num_filler: int = 16, vocab_size: int | None = None,
                 buckets: list[int] | None = None, max_distance: int | None = None, batch_size: int = 32,
                 train_examples: int = 100_000, val_examples: int = 512, seed: int = 0, num_workers: int = 0,
                 filler: str = "random", layout: str = "scattered"):
        super().__init__()
        self.task = RecallTask(task, seq_len, num_pairs, num_queries, num_keys, num_values, num_filler, vocab_size,
                               buckets, max_distance, filler, layout)
        for name, value in (("batch_size", batch_size), ("train_examples", train_examples),
                            ("val_examples", val_examples)):
            if value < 1:
                raise ValueError(f"data {name} must be >= 1, got {value}.")
        if num_workers < 0:
            raise ValueError(f"data num_workers must be >= 0, got {num_workers}.")
        self.seq_len, self.batch_size = seq_len, batch_size
        self.train_examples, self.val_examples, self.seed, self.num_workers = train_examples, val_examples, seed, num_workers
        self.bucket_names = bucket_names(self.task.edges)
        self.train_sampler: BlockSampler | None = None
        self._resume: dict | None = None

    @property
    def vocab_size(self) -> int:
        """Linked into ``model.arch.vocab_size`` by the CLI."""
        return self.task.vocab

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _loader(self, split: str, sampler) -> DataLoader:
        return DataLoader(RecallDataset(self.task, self.seed, split), batch_size=self.batch_size, sampler=sampler,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        self.train_sampler = BlockSampler(self.train_examples, rank=rank, world_size=world, seed=self.seed)
        if self._resume is not None:
            self.train_sampler.resume(self._resume["epoch"], self._resume["consumed"])
        return self._loader("train", EpochOffsetSampler(self.train_sampler))

    def val_dataloader(self) -> DataLoader:
        """Rank r scores sequences r, r + W, ...: disjoint slices whose union is the validation set."""
        rank, world = self._rank_world()
        return self._loader("validation", list(range(rank, self.val_examples, world)))

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()

    def state_dict(self) -> dict:
        if self.trainer is None:
            return {}
        epoch, consumed = fit_position(self.trainer, self.batch_size)
        return {"epoch": epoch, "consumed": consumed, "task": self.task.task, "vocab_size": self.vocab_size,
                "filler": self.task.filler, "layout": self.task.layout}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if state.get("task") not in (None, self.task.task):
            raise ValueError(f"the checkpoint was trained on synthetic task {state['task']!r}, not {self.task.task!r}.")
        trained = state.get("filler", "random")  # a checkpoint from before the option had random filler
        if trained != self.task.filler:
            raise ValueError(f"the checkpoint was trained with {trained!r} filler, not {self.task.filler!r}: pass "
                             f"--data.init_args.filler {trained}.")
        trained = state.get("layout", "scattered")
        if trained != self.task.layout:
            raise ValueError(f"the checkpoint was trained on the {trained!r} layout, not {self.task.layout!r}: pass "
                             f"--data.init_args.layout {trained}.")
        self._resume = {"epoch": state["epoch"], "consumed": state["consumed"]}
