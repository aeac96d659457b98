"""Data: the embedded corpus and tokenizer, sources, packing, exact sharding and resume offsets."""
import json

import pytest
import torch
from torch.utils.data import DataLoader

from sa_lightning.data import BlockSampler, LMDataModule, PackedBlocks, SourceConfig, documents, embedded_documents, prepare_tokens
from sa_lightning.data.tokenizer import EMBEDDED_FILE, load_tokenizer, train_embedded_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("embedded")


def test_embedded_corpus_is_real_text_with_a_held_out_split():
    train, val = list(embedded_documents("train")), list(embedded_documents("validation"))
    chars = sum(map(len, train)) + sum(map(len, val))
    assert 1e6 <= chars <= 5.1e6
    assert len(val) >= 20 and "Hamlet" in val[0] + val[-1] + "".join(val[:5])
    assert not {d.split(".")[0] for d in train} & {d.split(".")[0] for d in val}  # plays do not leak


def test_shipped_tokenizer_is_rebuilt_identically_from_the_corpus():
    rebuilt = train_embedded_tokenizer(embedded_documents("train"))
    shipped = json.loads(EMBEDDED_FILE.read_text())
    assert json.loads(rebuilt.to_str())["model"]["vocab"] == shipped["model"]["vocab"]


def test_tokenizer_roundtrips_and_has_eos(tok):
    text = "To be, or not to be: that is the question."
    assert tok.decode(tok(text)["input_ids"]) == text and len(tok) == 4096 and tok.eos_token_id == 0


def test_unknown_tokenizer_offline_names_the_alternative():
    with pytest.raises(ValueError, match="tokenizer: embedded"):
        load_tokenizer("no-such-org/no-such-tokenizer")


def test_packing_joins_documents_with_eos_and_carries_the_remainder(tmp_path, tok):
    docs = ["first document here", "a second, longer document with more words in it", "third"]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    folder = prepare_tokens(SourceConfig("files", paths=[str(tmp_path / "*.jsonl")]), tok, "embedded", tmp_path / "cache", progress=False)
    stream = [t for d in docs for t in (*tok(d)["input_ids"], tok.eos_token_id)]
    blocks = PackedBlocks(folder, seq_len=4)
    assert len(blocks) == len(stream) // 5
    joined = torch.cat([blocks[i] for i in range(len(blocks))]).tolist()
    assert joined == stream[: len(joined)]  # blocks cross document borders, nothing padded


def test_local_txt_jsonl_and_parquet_sources_read_the_same_documents(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = ["one doc\nwith two lines", "another doc"]
    for i, d in enumerate(docs):
        (tmp_path / f"d{i}.txt").write_text(d)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    pq.write_table(pa.table({"text": docs}), tmp_path / "d.parquet")
    assert list(documents(SourceConfig("files", paths=[str(tmp_path / "d*.txt")]))) == docs
    assert list(documents(SourceConfig("files", paths=[str(tmp_path / "d.jsonl")], text_field="body"))) == docs
    assert list(documents(SourceConfig("files", paths=[str(tmp_path / "*.parquet")]))) == docs


def test_hub_source_streams_through_load_dataset_with_a_local_stand_in(tmp_path):
    # the same code path as DKYoon/SlimPajama-6B, pointed at a local dataset folder
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps({"text": "hub doc"}) + "\n")
    assert list(documents(SourceConfig("hub", path=str(tmp_path), split="train"))) == ["hub doc"]


def test_hub_source_offline_says_it_needs_the_network():
    with pytest.raises(ConnectionError, match="needs the network.*kind: embedded"):
        list(documents(SourceConfig("hub", path="DKYoon/SlimPajama-6B", split="train")))


@pytest.mark.parametrize("make, error, message", [
    (lambda p: [str(p / "missing" / "*.txt")], FileNotFoundError, "matches no file"),
    (lambda p: [str(p / "x.csv")], ValueError, "unsupported extension"),
])
def test_bad_data_paths_fail_before_any_work(tmp_path, make, error, message):
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(error, match=message):
        LMDataModule(train=SourceConfig("files", paths=make(tmp_path)))


def test_empty_and_unreadable_corpora_fail_clearly(tmp_path, tok):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="empty"):
        prepare_tokens(SourceConfig("files", paths=[str(tmp_path / "empty.jsonl")]), tok, "embedded", tmp_path / "c", progress=False)
    (tmp_path / "bad.parquet").write_bytes(b"not a parquet file at all")
    with pytest.raises(ValueError, match="could not be read"):
        list(documents(SourceConfig("files", paths=[str(tmp_path / "bad.parquet")])))


def test_sampler_shards_are_disjoint_equal_and_cover_all_but_the_remainder():
    n, world = 103, 4
    shards = [BlockSampler(n, rank=r, world_size=world, seed=3) for r in range(world)]
    seen = [list(s) for s in shards]
    assert {len(s) for s in seen} == {n // world}
    flat = [i for s in seen for i in s]
    assert len(set(flat)) == len(flat) == n - n % world
    again = [list(BlockSampler(n, rank=r, world_size=world, seed=3)) for r in range(world)]
    assert again == seen  # deterministic
    for s in shards:
        s.set_epoch(1)
    assert [list(s) for s in shards] != seen  # reshuffled per epoch
    with pytest.raises(ValueError, match="fewer than the 4 ranks"):
        BlockSampler(3, world_size=4)


def test_sampler_resume_skips_exactly_the_consumed_blocks_of_that_epoch_only():
    full = BlockSampler(50, seed=1)
    resumed = BlockSampler(50, seed=1)
    resumed.resume(epoch=0, consumed=12)
    assert list(resumed) == list(full)[12:] and len(resumed) == 38
    resumed.set_epoch(1)
    full.set_epoch(1)
    assert list(resumed) == list(full)


def test_dataloader_workers_neither_repeat_nor_drop_blocks(tok):
    dm = LMDataModule(seq_len=64, batch_size=8, progress=False)
    dm.prepare_data()
    dm.setup()
    sampler = BlockSampler(len(dm.train_set), seed=0)
    ref = [b for b in DataLoader(dm.train_set, batch_size=8, sampler=sampler, num_workers=0)][:20]
    two = [b for _, b in zip(range(20), DataLoader(dm.train_set, batch_size=8, sampler=sampler, num_workers=2))]
    assert all(torch.equal(a, b) for a, b in zip(ref, two))


def test_datamodule_validation_set_is_fixed_and_unsharded():
    dm = LMDataModule(seq_len=64, batch_size=8, val_blocks=10, progress=False)
    dm.prepare_data()
    dm.setup()
    val = torch.cat(list(dm.val_dataloader()))
    assert val.shape == (10, 65) and dm.vocab_size == 4096
    assert dm.unigram_perplexity() > 100


@pytest.mark.slow  # a pytest session of its own, as a user starts one
def test_the_test_session_never_writes_into_the_users_cache_and_removes_its_own(tmp_path):
    """A user (or a cluster) exporting SA_LIGHTNING_CACHE keeps it clean: the tests cache tokens in a folder of
    their own, removed when the session ends."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    user, tmp = tmp_path / "shared_cache", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "SA_LIGHTNING_CACHE": str(user), "TMPDIR": str(tmp)}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_data.py::test_datamodule_validation_set_is_fixed_and_unsharded"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not user.exists()
    assert not list(tmp.glob("sa_lightning_cache_*"))  # the session's own folder is gone


def test_a_later_run_in_the_same_process_counts_its_first_batch_from_its_own_data_module(monkeypatch):
    """A study's worker trains cell after cell in one process: its later cells' "first training batch ... after
    start" must not count the cells before them."""
    from sa_lightning.data import datamodule as D

    monkeypatch.setattr(D, "_BUILT", [])
    first, later = D.LMDataModule(seq_len=64, progress=False), D.LMDataModule(seq_len=64, progress=False)
    assert first._built is None  # the process's own run: from the process's start, imports included
    assert later._built is not None and 0 <= D.time.perf_counter() - later._built < 60
