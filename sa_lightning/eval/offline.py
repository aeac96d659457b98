"""The offline lm-eval tasks, built reproducibly from the held-out plays of the embedded corpus.

Three tasks, one per kind of Table 1 column, so the embedded default exercises every code path that
the real tasks do:

- ``shakespeare_rolling``: rolling word perplexity over whole scenes (like wikitext).
- ``shakespeare_lastword``: predict a line's last word, which appears earlier in the passage (like
  LAMBADA, whose target words are guessable only from the wider context).
- ``shakespeare_choice``: pick a speech's true first line among four (like HellaSwag).

``build(out_dir)`` writes the data files; ``scripts/build_offline_tasks.py`` calls it, and a test
checks that the shipped files are what it builds.
"""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

TASKS_DIR = Path(__file__).parent / "tasks"
DATA_DIR = TASKS_DIR / "data"
TASK_NAMES = ("shakespeare_rolling", "shakespeare_lastword", "shakespeare_choice")
#: The shipped pass-key retrieval tasks (``tasks/passkey.py``) and their context length in tokens, which a
#: caller checks against a model's window before loading it (each YAML's ``metadata.context_length``).
CONTEXT_LENGTHS = {"passkey_512": 512, "passkey_1k": 1024, "passkey_2k": 2048, "passkey_4k": 4096}
SEED = 1606
CONTEXT_CHARS = 600
ITEMS = 400

_WORD = re.compile(r"[A-Za-z]{4,}")
_SPEAKER = re.compile(r"^[A-Z][A-Z .'-]+:$")


def _scenes() -> list[dict]:
    from ..data.corpus import EMBEDDED_DIR
    import gzip

    with gzip.open(EMBEDDED_DIR / "shakespeare_validation.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _context_before(text: str, end: int, chars: int = CONTEXT_CHARS) -> str:
    """Up to ``chars`` characters before ``end``, starting at a line boundary."""
    start = max(0, end - chars)
    if start > 0:
        start = text.index("\n", start) + 1 if "\n" in text[start:end] else start
    return text[start:end]


def rolling_docs(scenes: list[dict]) -> list[dict]:
    return [{"title": f"{s['play']}|{s['scene']}", "page": s["text"]} for s in scenes]


def lastword_docs(scenes: list[dict], rng: random.Random) -> list[dict]:
    """Passages that end in a line's last word (trailing punctuation dropped) which already occurs, as a
    whole word, in the passage before it."""
    found = []
    for scene in scenes:
        text = scene["text"]
        offset = 0
        for line in text.split("\n"):
            body = line.rstrip(".,;:!?'\"-) ")
            words = body.split(" ")
            end = offset + len(body)
            offset += len(line) + 1
            if len(words) < 3 or _SPEAKER.match(line) or not _WORD.fullmatch(words[-1]):
                continue
            target = words[-1]
            context = _context_before(text, end - len(target))
            if len(context) < CONTEXT_CHARS // 2 or not re.search(rf"\b{target}\b", context):
                continue
            found.append({"text": context + target})
    return sorted(rng.sample(found, min(ITEMS, len(found))), key=lambda d: found.index(d))


def choice_docs(scenes: list[dict], rng: random.Random) -> list[dict]:
    """The first line of a speech among three first lines of speeches from other plays."""
    speeches = []  # (play, context end, speaker line, first line)
    for scene in scenes:
        text = scene["text"]
        lines = text.split("\n")
        offset = 0
        for i, line in enumerate(lines[:-1]):
            if _SPEAKER.match(line) and 20 <= len(lines[i + 1]) <= 80 and not _SPEAKER.match(lines[i + 1]):
                speeches.append((scene["play"], text, offset + len(line), lines[i + 1]))
            offset += len(line) + 1
    docs = []
    for play, text, end, gold in rng.sample(speeches, min(ITEMS, len(speeches))):
        context = _context_before(text, end)
        if len(context) < CONTEXT_CHARS // 2:
            continue
        others = [s[3] for s in speeches if s[0] != play and 0.5 <= len(s[3]) / len(gold) <= 2 and s[3] != gold]
        choices = rng.sample(others, 3) + [gold]
        rng.shuffle(choices)
        docs.append({"query": context, "choices": ["\n" + c for c in choices], "label": choices.index(gold)})
    return docs


def build(out_dir: Path = DATA_DIR) -> dict[str, Path]:
    """Write every offline task's data as JSON lines; returns the files by task name."""
    scenes = _scenes()
    rng = random.Random(SEED)
    data = {
        "shakespeare_rolling": rolling_docs(scenes),
        "shakespeare_lastword": lastword_docs(scenes, rng),
        "shakespeare_choice": choice_docs(scenes, rng),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, docs in data.items():
        path = out_dir / f"{name}.jsonl"
        path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
        paths[name] = path
    return paths
