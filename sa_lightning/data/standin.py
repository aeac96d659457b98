"""Local stand-ins for the paper's hub data, built offline from the shipped corpus.

- ``write_slimpajama(folder)``: jsonl shards in SlimPajama's schema (``text`` plus
  ``meta.redpajama_set_name``), ``train-NNNNN.jsonl`` and ``validation-NNNNN.jsonl``: point a ``files``
  source (or ``--data.train.paths``) at them to run the paper's data config through the same
  ``load_dataset(..., streaming=True)`` path as the Hub.
- ``write_mistral_format_tokenizer(path)``: a ``tokenizer.json`` of the Mistral/Llama kind (BPE with
  byte fallback, ``▁`` for spaces via the normalizer, no pre-tokenizer, ``<unk> <s> </s>`` then the
  256 byte tokens, vocab up to 32000) trained on the shipped corpus. It is not Mistral's vocabulary;
  it has its model class and its pipeline, so it tokenizes at a comparable speed.
"""
from __future__ import annotations

import json
from pathlib import Path

from .corpus import embedded_documents

SETS = ("RedPajamaCommonCrawl", "RedPajamaC4", "RedPajamaGithub", "RedPajamaBook", "RedPajamaArXiv",
        "RedPajamaWikipedia", "RedPajamaStackExchange")


def write_slimpajama(folder: str | Path, shards: int = 8, min_train_tokens: int = 0, splits=("train", "validation")) -> Path:
    """Write ``shards`` train shards (the corpus repeated until it holds about ``min_train_tokens``
    tokens at ~4 characters a token) and one validation shard. Existing shards are kept."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split in splits:
        n = shards if split == "train" else 1
        if all((folder / f"{split}-{i:05d}.jsonl").is_file() for i in range(n)):
            continue
        docs = list(embedded_documents(split))
        chars = sum(map(len, docs))
        repeats = max(1, -(-min_train_tokens * 4 // chars)) if split == "train" else 1
        files = [open(folder / f"{split}-{i:05d}.jsonl", "w", encoding="utf-8") for i in range(n)]
        try:
            k = 0
            for r in range(repeats):
                for doc in docs:
                    text = doc if r == 0 else f"{doc}\n[copy {r}]"  # distinct documents, as a real corpus has
                    record = {"text": text, "meta": {"redpajama_set_name": SETS[k % len(SETS)]}}
                    files[k % n].write(json.dumps(record) + "\n")
                    k += 1
        finally:
            for f in files:
                f.close()
    return folder


def write_mistral_format_tokenizer(path: str | Path, vocab_size: int = 32000) -> Path:
    """Train and save the Mistral-format stand-in tokenizer (once; an existing file is kept)."""
    path = Path(path)
    if path.is_file():
        return path
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    # train on words (split at the space marker) to keep training fast; Mistral tokenizes without a pre-tokenizer
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(byte_tokens), special_tokens=specials, show_progress=False)
    tok.train_from_iterator(embedded_documents("train"), trainer=trainer)
    spec = json.loads(tok.to_str())
    learned = [t for t, _ in sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1]) if t not in specials]
    order = specials + byte_tokens + [t for t in learned if t not in byte_tokens]
    spec["model"]["vocab"] = {t: i for i, t in enumerate(order)}
    spec["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in enumerate(specials)]
    spec["pre_tokenizer"] = None
    spec["decoder"] = json.loads(decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                                    decoders.Strip(" ", 1, 0)]).__getstate__())
    spec["post_processor"] = None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, ensure_ascii=False))
    return path
