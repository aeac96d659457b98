"""Stream mode and cache mode of the data (issue: stream SlimPajama), below Lightning.

The split over ranks x workers, per-epoch reshuffling, exact resume of the loader with 0 and 2
workers (through epoch ends and between state snapshots), the parallel ``prepare``, cache checks,
validation slices and the bad inputs. The Lightning-level resume and DDP tests live in test_faults.py.
"""
import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from sa_lightning.data import LMDataModule, SourceConfig, load_tokenizer
from sa_lightning.data import stream as stream_mod
from sa_lightning.data.corpus import open_stream
from sa_lightning.data.packing import check_cache, prepare_tokens
from sa_lightning.data.stream import SplitPlan, StreamLoader, TokenStream


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("embedded")


def _docs(n: int) -> list[str]:
    words = "to be or not that is the question whether tis nobler in mind suffer slings arrows".split()
    return [f"document {i}: " + " ".join(words[(i * 7 + k) % len(words)] for k in range(3 + (i * 5) % 23))
            for i in range(n)]


def _write_shards(folder, shards: int, per_shard: int, field: str = "text") -> SourceConfig:
    folder.mkdir(parents=True, exist_ok=True)
    docs = _docs(shards * per_shard)
    for s in range(shards):
        with open(folder / f"train-{s:05d}.jsonl", "w") as f:
            for d in docs[s::shards]:
                f.write(json.dumps({field: d, "meta": {"redpajama_set_name": "RedPajamaBook"}}) + "\n")
    return SourceConfig("files", paths=[str(folder / "train-*.jsonl")], text_field="text")


def _stream(src, tok, seq_len=16, **kw) -> TokenStream:
    kw = {"seed": 5, "shuffle_buffer": 4, "read_batch": 3, **kw}
    return TokenStream(open_stream(src), src, tok, seq_len, **kw)


def _epoch_docs(ts: TokenStream, epoch: int) -> list[tuple]:
    return [tuple(d.tolist()) for d in ts._documents(ts._fresh_epoch(epoch))]


@pytest.mark.parametrize("shards, strategy", [(4, "shards"), (3, "examples")])
def test_two_ranks_by_two_workers_read_every_document_once_per_epoch(shards, strategy, tok, tmp_path, monkeypatch):
    src = _write_shards(tmp_path, shards, 6)
    everything = Counter(tuple(ids) for ids in tok(_docs(shards * 6), add_special_tokens=False)["input_ids"])
    plan = SplitPlan(shards, 4)
    assert plan.strategy == strategy
    assert ("example level" in plan.describe(2, 2)) == (strategy == "examples")
    orders = {}
    for epoch in (0, 1):
        seen = Counter()
        for rank in (0, 1):
            for worker in (0, 1):
                monkeypatch.setattr(stream_mod, "get_worker_info", lambda w=worker: SimpleNamespace(id=w, num_workers=2))
                docs = _epoch_docs(_stream(src, tok, rank=rank, world_size=2), epoch)
                assert docs, "every reader gets documents"
                seen.update(docs)
                orders[epoch, rank, worker] = docs
        assert seen == everything  # nothing read twice within the epoch, nothing left out
    assert any(orders[0, r, w] != orders[1, r, w] for r in (0, 1) for w in (0, 1))  # reshuffled per epoch


def _take(loader, n):
    it = iter(loader)
    out = [next(it) for _ in range(n)]
    return out, it


@pytest.mark.parametrize("workers, positions", [(0, range(1, 40)), (2, (3, 17, 33))])
def test_loader_resumes_exactly_at_any_batch_across_epochs(workers, positions, tok, tmp_path):
    src = _write_shards(tmp_path, 4, 5)  # 20 short documents: 40 batches cross several epochs
    make = lambda: StreamLoader(_stream(src, tok), batch_size=2, num_workers=workers, snapshot_every=4)  # noqa: E731
    reference, _ = _take(make(), 40)
    for k in positions:
        first = make()
        it = iter(first)
        for _ in range(k):
            next(it)
            first.mark_used()
        next(it)  # fetched ahead, as Lightning does, but never used
        state = first.stream_state()
        del it
        resumed = make()
        resumed.load_stream_state(state)
        rest, _ = _take(resumed, 40 - k)
        assert all(torch.equal(a, b) for a, b in zip(rest, reference[k:])), f"resume after batch {k}"


def test_blocks_carry_each_documents_tail_and_join_documents_with_eos(tok, tmp_path):
    src = _write_shards(tmp_path, 1, 8)
    ts = _stream(src, tok, seq_len=8, shuffle_buffer=0)
    docs = _epoch_docs(_stream(src, tok, seq_len=8, shuffle_buffer=0), 0)
    flat = [t for d in docs for t in (*d, tok.eos_token_id)]
    blocks = [b for _, b in zip(range(len(flat) // 9), iter(ts))]
    assert torch.cat(blocks).tolist() == flat[: 9 * len(blocks)]


def test_state_is_plain_types_and_tensors_and_refuses_another_reader(tok, tmp_path):
    import io

    src = _write_shards(tmp_path, 2, 4)
    ts = _stream(src, tok)
    it = iter(ts)
    next(it)
    buf = io.BytesIO()
    torch.save(ts.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)  # what checkpoints need
    with pytest.raises(ValueError, match="reader differs.*seed 5 -> 6"):
        _stream(src, tok, seed=6).load_state_dict(state)
    loader = StreamLoader(_stream(src, tok), batch_size=2, num_workers=0, world_size=1)
    with pytest.raises(ValueError, match="read by 2 rank"):
        loader.load_stream_state({"world_size": 2, "ranks": [{}, {}]})


def test_prepare_with_several_processes_writes_the_single_process_cache(tok, tmp_path):
    src = _write_shards(tmp_path / "src", 4, 30)
    one = prepare_tokens(src, tok, "embedded", tmp_path / "one", progress=False)
    two = prepare_tokens(src, tok, "embedded", tmp_path / "two", progress=False, num_proc=2)
    assert (one / "tokens.bin").read_bytes() == (two / "tokens.bin").read_bytes()
    capped = prepare_tokens(src, tok, "embedded", tmp_path / "cap", max_tokens=1000, progress=False, num_proc=2)
    assert (capped / "tokens.bin").read_bytes() == (one / "tokens.bin").read_bytes()[:2000]  # uint16 tokens


def test_a_shard_that_fails_is_named_and_no_process_is_left(tok, tmp_path, monkeypatch):
    """A shard's error reaches the command as one sentence naming the shard; the shards still running end, and the
    half-written cache folder goes."""
    import multiprocessing as mp

    from sa_lightning.data import packing

    real = packing._tokenize_shard

    def fails_at_one(task):
        if task[1] == 1:
            raise ValueError("unreadable line 3")
        return real(task)

    monkeypatch.setattr(packing, "_tokenize_shard", fails_at_one)  # the forked shard processes inherit it
    src = _write_shards(tmp_path / "src", 4, 30)
    with pytest.raises(ValueError, match="tokenizing shard 1 of 4 of .* failed: ValueError: unreadable line 3"):
        prepare_tokens(src, tok, "embedded", tmp_path / "c", progress=False, num_proc=2)
    assert not mp.active_children() and not list((tmp_path / "c").rglob("*"))


def _hold_the_bar_lock(marker) -> None:
    """In a forked child: take tqdm's write lock (as ``datasets`` does while it opens a stream), say so in
    ``marker``, and keep it until the child is ended."""
    import time

    from tqdm.std import tqdm

    tqdm.get_lock().acquire()
    marker.write_text("")
    time.sleep(120)


def _wait_for(marker, seconds: float = 30.0) -> bool:
    import time

    end = time.monotonic() + seconds
    while not marker.exists() and time.monotonic() < end:
        time.sleep(0.05)
    return marker.exists()


def _assert_the_bar_lock_is_free(message):
    """If a child kept tqdm's lock, this process gets fresh locks before failing, so that the worker's next tests
    do not each wait their 600 s on it."""
    from tqdm.std import TqdmDefaultWriteLock

    from sa_lightning.data.corpus import own_progress_locks

    lock = TqdmDefaultWriteLock.mp_lock
    if not lock.acquire(timeout=10):
        own_progress_locks()
        pytest.fail(message)
    lock.release()


def test_a_shard_process_ended_while_it_shows_progress_leaves_the_commands_progress_bars_free(tok, tmp_path,
                                                                                             monkeypatch):
    """The shards still running are ended by SIGTERM (the cap reached, a shard failed). One that dies inside a
    progress bar (datasets draws one while it opens the shard) must not take the command's bar lock with it:
    before, the next progress bar in the command waited forever (CI: two tests hung 600 s in ``load_dataset``)."""
    from tqdm.std import tqdm

    from sa_lightning.data import packing

    tqdm(disable=True).close()  # the command has shown a bar before it forks, so tqdm's process lock exists
    held = tmp_path / "held"

    def holds_or_fails(task):
        if task[1] == 1:  # dies, by SIGTERM, while it holds tqdm's write lock
            _hold_the_bar_lock(held)
        _wait_for(held)  # shard 0 fails only once shard 1 holds the lock
        raise ValueError("unreadable line 3")

    monkeypatch.setattr(packing, "_tokenize_shard", holds_or_fails)
    src = _write_shards(tmp_path / "src", 2, 5)
    with pytest.raises(ValueError, match="tokenizing shard 0 of 2 .* failed: ValueError: unreadable line 3"):
        prepare_tokens(src, tok, "embedded", tmp_path / "c", progress=False, num_proc=2)
    _assert_the_bar_lock_is_free("a shard process ended holding the command's progress-bar lock")


def test_a_stale_or_foreign_cache_folder_is_refused(tok, tmp_path):
    src = _write_shards(tmp_path / "src", 2, 5)
    folder = prepare_tokens(src, tok, "embedded", tmp_path / "c", progress=False)
    check_cache(folder, src, tok, "embedded")
    with open(tmp_path / "src" / "train-00000.jsonl", "a") as f:
        f.write(json.dumps({"text": "added since", "meta": {"redpajama_set_name": "RedPajamaBook"}}) + "\n")
    with pytest.raises(ValueError, match="stale or was built for other data.*source files changed.*cli.py prepare"):
        prepare_tokens(src, tok, "embedded", tmp_path / "c", progress=False)
    (folder / "meta.json").unlink()
    with pytest.raises(ValueError, match="holds no meta.json, so it is not a finished cache"):
        prepare_tokens(src, tok, "embedded", tmp_path / "c", progress=False)
    rebuilt = prepare_tokens(src, tok, "embedded", tmp_path / "c", progress=False, overwrite=True)
    assert json.loads((rebuilt / "meta.json").read_text())["num_documents"] == 11


def _dm(tmp_path, train: SourceConfig, **kw) -> LMDataModule:
    return LMDataModule(train=train, seq_len=16, batch_size=2, val_blocks=5, progress=False,
                        cache_dir=str(tmp_path / "cache"), **kw)


def test_validation_slices_are_disjoint_over_ranks_and_cover_the_set(tok, tmp_path):
    dm = _dm(tmp_path, SourceConfig("embedded"))
    dm.prepare_data()
    dm.setup()
    seen = []
    for rank in range(3):
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=3)
        seen += [row for b in dm.val_dataloader() for row in b.tolist()]
    whole = [dm.val_set[i].tolist() for i in range(len(dm.val_set))]
    assert sorted(seen) == sorted(whole) and len(seen) == 5


def test_modes_default_by_source_and_stream_mode_streams(tok, tmp_path):
    src = _write_shards(tmp_path / "src", 2, 20)
    assert _dm(tmp_path, SourceConfig("embedded")).mode == "cache"
    dm = _dm(tmp_path, src)
    assert dm.mode == "stream"
    dm.prepare_data()
    dm.setup()
    assert dm.train_set is None and dm.unigram_perplexity() > 1
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (2, 17) and batch.dtype == torch.int64


@pytest.mark.parametrize("make, error, message", [
    (lambda t: _dm(t, SourceConfig("embedded"), mode="streaming"), ValueError, "data mode must be one of auto, stream, cache"),
    (lambda t: _dm(t, _write_shards(t / "s", 1, 3), max_train_tokens=10), ValueError, "max_train_tokens caps the token cache"),
    (lambda t: _dm(t, _write_shards(t / "s", 2, 3, field="body")), KeyError, "have no field 'text'.*they have body"),
    (lambda t: _dm(t, SourceConfig("files", paths=[str(_empty(t))])), ValueError, "is empty"),
    (lambda t: _dm(t, SourceConfig("files", paths=[str(_one_line(t))])), ValueError, "fewer than one block of seq_len"),
])
def test_bad_stream_inputs_fail_in_one_sentence_before_training(make, error, message, tmp_path):
    with pytest.raises(error, match=message):
        dm = make(tmp_path)
        dm.setup()


def _empty(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    return tmp_path / "empty.jsonl"


def _one_line(tmp_path):
    (tmp_path / "short.jsonl").write_text(json.dumps({"text": "too short"}) + "\n")
    return tmp_path / "short.jsonl"


@pytest.mark.slow
def test_cache_mode_on_several_ranks_without_a_cache_names_cli_prepare(tmp_path):
    dm = _dm(tmp_path, SourceConfig("embedded"))
    dm.check_launch(1)  # one rank may tokenize for itself
    with pytest.raises(ValueError, match="cache mode on 2 ranks needs the token cache.*python cli.py prepare"):
        dm.check_launch(2)
    dm.prepare()
    dm.check_launch(2)


class _HoldsTheBarLock(torch.utils.data.IterableDataset):
    """Yields one block, then holds tqdm's write lock (as ``datasets`` does while it opens a stream) until ended."""

    def __init__(self, marker):
        self.marker = marker

    def __iter__(self):
        yield torch.zeros(4, dtype=torch.long)
        _hold_the_bar_lock(self.marker)


@pytest.mark.slow
def test_a_stream_worker_ended_while_it_shows_progress_leaves_the_trainers_progress_bars_free(tmp_path):
    """A stream loader's worker still busy when the loader shuts down is ended by SIGTERM after 5 s; one ended inside
    a progress bar must not keep the trainer's bar lock, or the next validation bar waits forever."""
    from tqdm.std import tqdm

    tqdm(disable=True).close()  # the trainer has drawn a bar before the workers fork
    marker = tmp_path / "held"
    loader = stream_mod.StreamLoader(_HoldsTheBarLock(marker), batch_size=1, num_workers=1)
    batches = iter(loader)
    next(batches)
    assert _wait_for(marker)
    loader._iterator._shutdown_workers()
    _assert_the_bar_lock_is_free("a loader worker ended holding the trainer's progress-bar lock")
