"""Stream mode: a checkpoint's stream position continues only in a run that reads the same stream.

A resume with another batch size, seq_len, worker count, world size, seed or set of source files is refused
in one sentence naming both values, when the DataModule's state is loaded (before any loader exists); the
same data at another path resumes exactly; old checkpoints are accepted with one line; a bad file read in a
DataLoader worker fails in one line naming the file. In-process objects only (no training runs), so fast.
"""
import io
import json
import re
import shutil
from types import SimpleNamespace

import pytest
import torch

from sa_lightning.data import LMDataModule, SourceConfig, load_tokenizer
from sa_lightning.data.corpus import open_stream, source_identity
from sa_lightning.data.resume import differences
from sa_lightning.data.stream import StreamLoader, TokenStream

from .test_stream import _write_shards

USED = 5  # batches the interrupted run used before its checkpoint


def _dm(cache, folder, **kw) -> LMDataModule:
    kw = {"seq_len": 16, "batch_size": 2, "num_workers": 2, "seed": 3, **kw}
    world = kw.pop("world_size", 1)
    dm = LMDataModule(train=SourceConfig("files", paths=[str(folder / "train-*.jsonl")]), val_blocks=5,
                      progress=False, cache_dir=str(cache), shuffle_buffer=4, read_batch=3, **kw)
    dm.trainer = SimpleNamespace(global_rank=0, world_size=world, training=True, is_global_zero=True)
    return dm


def _take(loader, n, fetch_ahead=False):
    it, out = iter(loader), []
    for _ in range(n):
        out.append(next(it))
        loader.mark_used()
    if fetch_ahead:
        next(it)  # as Lightning does; that batch is never used
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A stream read by 2 workers, interrupted after ``USED`` batches: (source folder, cache, state, reference)."""
    root = tmp_path_factory.mktemp("guard")
    folder = root / "src"
    _write_shards(folder, 4, 6)
    dm = _dm(root / "cache", folder)
    dm.prepare_data()
    dm.setup()
    reference = _take(dm.train_dataloader(), USED + 6)
    dm = _dm(root / "cache", folder)
    dm.setup()
    _take(dm.train_dataloader(), USED, fetch_ahead=True)
    buf = io.BytesIO()
    torch.save(dm.state_dict(), buf)
    buf.seek(0)
    return folder, root / "cache", torch.load(buf, weights_only=True), reference  # as a checkpoint holds it


@pytest.mark.parametrize("change, said", [
    ({"batch_size": 4}, r"data\.batch_size was 2 but is 4 now; .*\(--data\.batch_size 2\)"),
    ({"seq_len": 8}, r"data\.seq_len was 16 but is 8 now; .*\(--data\.seq_len 16\)"),
    ({"num_workers": 1}, r"data\.num_workers was 2 but is 1 now; .*\(--data\.num_workers 2\)"),
    ({"world_size": 2}, r"number of ranks \(trainer\.devices x trainer\.num_nodes\) was 1 but is 2 now; .*"
                        r"\(trainer\.devices x trainer\.num_nodes = 1\)"),
    ({"seed": 4}, r"data seed \(seed_everything\) was 3 but is 4 now; .*\(--seed_everything 3\)"),
    ({"batch_size": 8, "num_workers": 0},  # every difference at once
     r"data\.batch_size was 2 but is 8 now; data\.num_workers was 2 but is 0 now; .*"
     r"\(--data\.batch_size 2, --data\.num_workers 2\)"),
])
def test_a_resume_with_other_settings_is_refused_naming_both_values(saved, change, said):
    folder, cache, state, _ = saved
    with pytest.raises(ValueError, match=said) as err:
        _dm(cache, folder, **change).load_state_dict(state)
    message = str(err.value)
    assert message.startswith("the checkpoint's data stream cannot continue in this run, because ")
    assert message.endswith("--model.init_weights <the checkpoint> instead of --ckpt_path (a fresh data stream and "
                            "optimizer).") and "\n" not in message


def test_validate_and_test_restore_the_state_without_reading_the_stream(saved):
    folder, cache, state, _ = saved
    dm = _dm(cache, folder, batch_size=4, world_size=2)
    dm.trainer.state = SimpleNamespace(fn="validate")  # cli.py validate --ckpt_path on one process
    dm.load_state_dict(state)


def _copy(saved, tmp_path):
    folder = tmp_path / "moved"
    shutil.copytree(saved[0], folder)
    return folder


def test_a_deleted_or_edited_shard_is_refused_naming_the_file(saved, tmp_path):
    folder, cache, state, _ = saved
    moved = _copy(saved, tmp_path)
    size = (moved / "train-00001.jsonl").stat().st_size
    with open(moved / "train-00001.jsonl", "a") as f:
        f.write(json.dumps({"text": "added since"}) + "\n")
    grown = (moved / "train-00001.jsonl").stat().st_size
    with pytest.raises(ValueError, match=re.escape(
            f"data.train's 4 files changed (train-00001.jsonl was {size} bytes and is {grown} now); "
            "resume as the checkpoint was written (data.train's files as they were), or start a new run")):
        _dm(cache, moved).load_state_dict(state)
    gone = (moved / "train-00003.jsonl").stat().st_size
    (moved / "train-00003.jsonl").unlink()
    with pytest.raises(ValueError, match=re.escape(
            f"data.train's files were 4 but are 3 now (train-00003.jsonl ({gone} bytes) is gone; "
            f"train-00001.jsonl was {size} bytes and is {grown} now)")):
        _dm(cache, moved).load_state_dict(state)


def test_the_same_stream_at_another_path_resumes_exactly(saved, tmp_path):
    _, cache, state, reference = saved
    dm = _dm(cache, _copy(saved, tmp_path))  # the same files copied elsewhere (a node's local disk)
    dm.setup()
    dm.load_state_dict(state)
    rest = _take(dm.train_dataloader(), 6)
    assert all(torch.equal(a, b) for a, b in zip(rest, reference[USED:]))


def test_an_old_checkpoint_is_accepted_with_one_line_but_its_batch_size_is_still_checked(saved, capsys):
    folder, cache, state, _ = saved
    old = {k: v for k, v in state.items() if k != "stream_identity"}
    _dm(cache, folder).load_state_dict(old)
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("data: this checkpoint predates the stream's record of its source files")
    with pytest.raises(ValueError, match=r"data\.batch_size was 2 but is 4 now.*data\.seq_len was 16 but is 8 now"):
        _dm(cache, folder, batch_size=4, seq_len=8).load_state_dict(old)


def test_hub_sources_compare_dataset_revision_and_shards(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(json.dumps({"text": "hub doc"}) + "\n")
    src = SourceConfig("hub", path=str(tmp_path), split="train")
    now = source_identity(src, open_stream(src))
    assert now["dataset"] == str(tmp_path) and now["num_shards"] == 1
    found = differences({"source": dict(now, revision="a" * 40, num_shards=2)}, {"source": dict(now, revision="b" * 40)})
    assert [fix for _, fix in found] == ["--data.train.revision " + "a" * 40, "data.train as it was"]
    assert differences({"source": dict(now, revision=None)}, {"source": dict(now, revision="b" * 40)}) == []
    streamed = SimpleNamespace(num_shards=48, _ex_iterable=SimpleNamespace(kwargs={"files": [
        f"hf://datasets/DKYoon/SlimPajama-6B@{'c' * 40}/data/train-{i:05d}-of-00048.parquet" for i in range(48)]}))
    assert source_identity(SourceConfig("hub", path="DKYoon/SlimPajama-6B"), streamed)["revision"] == "c" * 40


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("embedded")


def _bad_source(folder, line: str) -> SourceConfig:
    src = _write_shards(folder, 3, 8)
    with open(folder / "train-00001.jsonl", "a") as f:
        f.write(line + "\n")
    return src


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("line, said", [
    ('{"text": "cut sh', r"line 9 of data file '.*train-00001\.jsonl' of files:.* is not valid JSON \(JSONDecodeError: "
                        r"Invalid control character.*\); repair the file or remove it from the data paths\."),
    ('{"meta": {"redpajama_set_name": "RedPajamaBook"}}',
     r"record 9 of data file '.*train-00001\.jsonl' has no text in field 'text'; repair or remove that record, "
     r"or set text_field\."),
    ('{"text": 12345}', r"line 9 of data file '.*train-00001\.jsonl' has int 12345 in field 'text', where text must be "
                        r"a string; repair or remove that record\."),
    ('{"text": ["a", "list"]}', r"line 9 of data file '.*train-00001\.jsonl' has list \[\"a\", \"list\"\] in field 'text'"),
])
def test_a_bad_file_read_in_a_worker_fails_in_one_line_naming_it(workers, line, said, tok, tmp_path):
    src = _bad_source(tmp_path, line)
    stream = TokenStream(open_stream(src), src, tok, 16, seed=0, shuffle_buffer=0, read_batch=4)
    with pytest.raises(ValueError, match=said) as err:
        _take(StreamLoader(stream, batch_size=2, num_workers=workers), 100)
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)


def test_a_damaged_json_file_says_one_sentence_and_datasets_logs_no_line_of_its_own(tok, tmp_path, capfd):
    """datasets logs "Failed to load JSON from file ..." before raising; the filter that drops it is installed
    by the reader that raises the sentence naming the file (``corpus._QuietBadJson``), not at import."""
    src = _bad_source(tmp_path, '{"text": "cut sh')
    stream = TokenStream(open_stream(src), src, tok, 16, seed=0, shuffle_buffer=0, read_batch=4)
    with pytest.raises(ValueError, match="is not valid JSON"):
        _take(StreamLoader(stream, batch_size=2, num_workers=0), 100)
    captured = capfd.readouterr()
    assert "Failed to load JSON" not in captured.out + captured.err


def test_the_unigram_sample_rebuilds_itself_when_its_source_changed(tmp_path, capsys):
    folder = tmp_path / "src"
    _write_shards(folder, 2, 6)
    dm = _dm(tmp_path / "cache", folder, num_workers=0)
    dm.prepare_data()
    with open(folder / "train-00000.jsonl", "a") as f:
        f.write(json.dumps({"text": "added since"}) + "\n")
    dm = _dm(tmp_path / "cache", folder, num_workers=0)
    dm.prepare_data()  # no longer refused with advice (prepare --overwrite) that never rebuilt this cache
    assert "is out of date (the source files changed since it was built); rebuilding it" in capsys.readouterr().out
    dm.setup()
    assert json.loads((dm.unigram_sample.path.parent / "meta.json").read_text())["num_documents"] == 13
