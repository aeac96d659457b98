"""Stream mode: may a checkpoint's reader positions continue in this run? Checked in the main process of
every rank when the DataModule's state is loaded (before any loader or worker exists, before any step),
so that a refusal is one sentence on every rank and never a hang or a silently repeated batch.

A stream position is only meaningful for the run that wrote it:
- ``batch_size`` and ``num_workers``: with workers, each worker produces whole batches in turn and the
  loader's state counts batches since a worker's snapshot, so another batch size or worker count deals
  rows that were already trained on (a tester saw 8 of 8 rows again). Another batch size also changes
  what the run's steps mean (tokens per step, the schedule), so it is refused with 0 workers too.
- ``world_size``: the readers are ranks x workers; their shards are dealt by that number.
- ``seq_len`` and ``seed``: the carried tokens are cut into blocks of seq_len + 1; the seed orders shards.
- the source: a position is (shard, record) in the files as they were; a deleted, added or edited file
  moves every later record. Files are compared by their path below the files' common folder and their
  size, in reading order (not by that folder, so a copy on another disk resumes); an edit that keeps a
  file's size is not seen.
"""
from __future__ import annotations

IDENTITY_VERSION = 1


def stream_identity(*, batch_size: int, world_size: int, num_workers: int, seq_len: int, seed: int,
                    source: dict) -> dict:
    """What the DataModule saves beside the stream state (plain types only, for ``weights_only`` loads)."""
    return {"version": IDENTITY_VERSION, "batch_size": int(batch_size), "world_size": int(world_size),
            "num_workers": int(num_workers), "seq_len": int(seq_len), "seed": int(seed), "source": dict(source)}


def legacy_identity(state: dict) -> dict:
    """What a checkpoint written before ``stream_identity`` existed still tells: its batch size, ranks and
    workers, and, from a reader's own identity, seq_len, seed and the source's description (no file sizes)."""
    stream = state.get("stream") or {}
    ranks = stream.get("ranks") or [None]
    first = ranks[0] if isinstance(ranks[0], dict) else {}
    workers = None
    if "_snapshot" in first:
        workers = (first["_snapshot"].get("_main_snapshot") or {}).get("_num_workers")
    elif "_num_yielded" in first:
        workers = 0
    reader = _find_identity(first) or {}
    block = reader.get("block")
    return {"version": 0, "batch_size": state.get("batch_size"), "world_size": stream.get("world_size"),
            "num_workers": workers, "seq_len": None if block is None else block - 1, "seed": reader.get("seed"),
            "source": {"describe": reader.get("source")}}


def _find_identity(node):
    if isinstance(node, dict):
        if isinstance(node.get("identity"), dict):
            return node["identity"]
        for value in node.values():
            found = _find_identity(value)
            if found:
                return found
    return None


_SETTINGS = (  # key, what it is called, how to set it back
    ("batch_size", "data.batch_size", "--data.batch_size {}"),
    ("seq_len", "data.seq_len", "--data.seq_len {}"),
    ("num_workers", "data.num_workers", "--data.num_workers {}"),
    ("world_size", "the number of ranks (trainer.devices x trainer.num_nodes)", "trainer.devices x trainer.num_nodes = {}"),
    ("seed", "the data seed (seed_everything)", "--seed_everything {}"),
)


def differences(saved: dict, now: dict) -> list[tuple[str, str]]:
    """(what differs, saying both values; how to set it back) for every difference; None is not compared."""
    found = []
    for key, what, fix in _SETTINGS:
        a, b = saved.get(key), now.get(key)
        if a is not None and b is not None and a != b:
            found.append((f"{what} was {a} but is {b} now", fix.format(a)))
    return found + _source_differences(saved.get("source") or {}, now.get("source") or {})


def _source_differences(saved: dict, now: dict) -> list[tuple[str, str]]:
    if "kind" not in saved:  # an old checkpoint: only its description is known
        a, b = saved.get("describe"), now.get("describe")
        if a is not None and b is not None and a != b:
            return [(f"data.train was {a} but is {b} now", f"data.train: {a}")]
        return []
    if saved["kind"] != now.get("kind"):
        return [(f"data.train was {saved.get('describe')} but is {now.get('describe')} now",
                 f"data.train: {saved.get('describe')}")]
    found = []
    if saved.get("text_field") != now.get("text_field"):
        found.append((f"data.train.text_field was {saved.get('text_field')!r} but is {now.get('text_field')!r} now",
                      f"--data.train.text_field {saved.get('text_field')}"))
    if saved["kind"] in ("files", "embedded"):
        change = _file_changes(saved.get("files") or [], now.get("files") or [])
        if change:
            n, m = len(saved.get("files") or []), len(now.get("files") or [])
            found.append((f"data.train's files were {n} but are {m} now ({change})" if n != m else
                          f"data.train's {n} files changed ({change})", "data.train's files as they were"))
        return found
    for key, what in (("dataset", "data.train.path"), ("name", "data.train.name"), ("split", "data.train.split"),
                      ("revision", "data.train's revision"), ("num_shards", "data.train's shard count")):
        a, b = saved.get(key), now.get(key)
        if a is not None and b is not None and a != b:
            fix = f"--data.train.revision {a}" if key == "revision" else (
                "data.train as it was" if key == "num_shards" else f"--{what} {a}")
            found.append((f"{what} was {a} but is {b} now", fix))
    return found


def _file_changes(saved: list, now: list, show: int = 3) -> str:
    """'train-00003.jsonl (812 bytes) is gone; train-00001.jsonl was 812 bytes and is 900 now', at most
    ``show`` of each kind; '' when the files are the same."""
    before, after = {name: size for name, size in saved}, {name: size for name, size in now}
    if [list(f) for f in saved] == [list(f) for f in now]:
        return ""
    gone = [f"{n} ({before[n]} bytes) is gone" for n in before if n not in after]
    new = [f"{n} ({after[n]} bytes) is new" for n in after if n not in before]
    edited = [f"{n} was {before[n]} bytes and is {after[n]} now" for n in before if n in after and before[n] != after[n]]
    said = []
    for items in (gone, edited, new):
        said += items[:show] + ([f"{len(items) - show} more like it"] if len(items) > show else [])
    return "; ".join(said) or "the same files read in another order"


def check_stream_resume(state: dict, now: dict, say=print) -> None:
    """Refuse, in one sentence naming every difference with both values, a checkpoint's stream position that
    cannot continue in a run set up as ``now``; ``say`` the one line about what an old checkpoint cannot tell."""
    saved = state.get("stream_identity")
    if saved is None:
        saved = legacy_identity(state)
        say("data: this checkpoint predates the stream's record of its source files, so a changed, added or "
            "deleted source file cannot be detected on this resume (batch size, ranks, workers, seq_len, seed "
            "and the source paths are still checked).")
    found = differences(saved, now)
    if found:
        said = "; ".join(what for what, _ in found)
        fixes = ", ".join(fix for _, fix in found)
        raise ValueError(f"the checkpoint's data stream cannot continue in this run, because {said}; resume as the "
                         f"checkpoint was written ({fixes}), or start a new run from its weights alone with "
                         "--model.init_weights <the checkpoint> instead of --ckpt_path (a fresh data stream and "
                         "optimizer).")
