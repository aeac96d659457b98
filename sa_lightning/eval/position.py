"""Long-text perplexity by token position: does a patched model still use what lies far back?

Each document is exactly ``length`` tokens of one held-out play of the embedded corpus (its scenes in order,
cut without overlap), run whole in one forward pass (short ones several to a batch: all have the same length, so
no row is padded, and a patched model draws each row's σ from its own tokens), so every token sees the attention
pattern of the whole document: SA's permutation is drawn over all ``length`` tokens, as in a real long
prompt. (Scoring each bucket as a shorter prefix would draw SA over fewer tokens, and so a denser mask, than the
document has.)
The loss of each predicted token is then put in a bucket by its distance from the start: 1-63, 64-127,
128-255, ... so the columns say how perplexity falls, or stops falling, as more context lies behind a token.

This is not an lm-eval task: lm-eval returns one log-likelihood per request, never per position. Names are
``position_ppl_<length>`` (``position_ppl_2k``, ``position_ppl_4k``, ``position_ppl_1024``).
"""
from __future__ import annotations

import functools
import gzip
import json
import math
import re

import torch

PATTERN = re.compile(r"^position_ppl_(\d+)(k?)$")


def is_position_task(name: str) -> bool:
    return bool(PATTERN.match(str(name)))


def context_length(name: str) -> int:
    """``position_ppl_2k`` -> 2048, ``position_ppl_1500`` -> 1500."""
    number, kilo = PATTERN.match(name).groups()
    return int(number) * (1024 if kilo else 1)


def buckets(length: int, first: int = 64) -> list[tuple[int, int]]:
    """Distance-from-start buckets [lo, hi) of the predicted tokens: [1, first), then doubling up to ``length``."""
    edges = [1, first]
    while edges[-1] * 2 < length:
        edges.append(edges[-1] * 2)
    edges.append(length)
    return [(lo, hi) for lo, hi in zip(edges, edges[1:]) if hi > lo]


def bucket_name(lo: int, hi: int) -> str:
    return f"ppl@{lo}-{hi - 1}"


@functools.cache
def _plays() -> tuple[str, ...]:
    """The held-out plays, each its scenes joined in order (a long real document apiece)."""
    from ..data.corpus import EMBEDDED_DIR

    texts: dict[str, list[str]] = {}
    with gzip.open(EMBEDDED_DIR / "shakespeare_validation.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            texts.setdefault(row["play"], []).append(row["text"])
    return tuple("\n\n".join(scenes) for _, scenes in sorted(texts.items()))


_TOKENIZED: dict[int, tuple[object, list[list[int]]]] = {}


def _play_tokens(tokenizer) -> list[list[int]]:
    """The plays' tokens, once per tokenizer object (a sweep scores the same documents in every cell)."""
    held = _TOKENIZED.get(id(tokenizer))
    if held is None or held[0] is not tokenizer:
        held = (tokenizer, [tokenizer(text, add_special_tokens=False)["input_ids"] for text in _plays()])
        _TOKENIZED[id(tokenizer)] = held
    return held[1]


def documents(tokenizer, length: int, limit: float | None = None) -> list[list[int]]:
    """Token lists of exactly ``length`` tokens (a BOS first when the tokenizer has one), cut without overlap
    from each play in turn, so that any prefix of the list spreads over the plays. ``limit`` is a count, or
    below 1 a fraction of the documents (as lm-eval's ``--limit``)."""
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    per_play = []
    for ids in _play_tokens(tokenizer):
        body = length - len(bos)
        per_play.append([bos + ids[i:i + body] for i in range(0, len(ids) - body + 1, body)])
    docs = [doc for group in zip(*per_play) for doc in group]  # play A, B, C, A, B, C, ...
    if not docs:
        raise ValueError(f"the held-out plays hold no document of {length} tokens for this tokenizer.")
    if limit is not None and 0 < limit < 1:
        limit = max(1, int(len(docs) * limit))
    return docs[:int(limit)] if limit else docs


#: tokens per forward pass: documents shorter than this go several to a batch (rows = BATCH_TOKENS // length)
BATCH_TOKENS = 2048


def position_perplexity(model, tokenizer, length: int, *, limit: float | None = None,
                        progress: bool = False) -> dict[str, float]:
    """``{"ppl": all predicted tokens, "ppl@lo-hi": per bucket, "docs": count}`` over ``documents(...)``,
    each document whole in one forward pass (no padding)."""
    return position_records(model, tokenizer, length, limit=limit, progress=progress)[0]


def position_records(model, tokenizer, length: int, *, limit: float | None = None, progress: bool = False,
                     batch_tokens: int = BATCH_TOKENS) -> tuple[dict[str, float], list[dict]]:
    """``position_perplexity``'s metrics and one record per document: ``{"doc_id": i, "nll": [...]}``, where
    ``nll[j]`` is the loss of the token at position j + 1 (its distance from the start; rounded to 1e-4), so that
    two runs pair token by token. ``metrics_of`` gives the metrics back from the losses. Documents go
    ``batch_tokens // length`` to a forward pass (at least one): on a CPU, 16 rows of 128 tokens read about 1.6x
    as many tokens a second as one row does."""
    docs = documents(tokenizer, length, limit)
    device = next(model.parameters()).device
    rows = max(1, batch_tokens // length)
    losses = []
    for start in range(0, len(docs), rows):
        ids = torch.tensor(docs[start:start + rows], device=device)
        with torch.no_grad():
            logits = model(ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
        losses += nll.view(len(ids), -1).double().cpu()
        if progress:
            print(f"  position_ppl_{length}: document {len(losses)}/{len(docs)}", flush=True)
    records = [{"doc_id": i, "nll": [round(x, 4) for x in nll.tolist()]} for i, nll in enumerate(losses)]
    return metrics_of(torch.stack(losses), length), records


def bucket_means(nll, length: int):
    """(documents, buckets) mean NLL of each document's tokens in each of ``buckets(length)``; ``nll`` is
    (documents, length - 1), token t (t >= 1 tokens from the start) at column t - 1."""
    nll = torch.as_tensor(nll, dtype=torch.float64)
    return torch.stack([nll[:, lo - 1:hi - 1].mean(dim=1) for lo, hi in buckets(length)], dim=1)


def metrics_of(nll, length: int) -> dict[str, float]:
    """The metrics of ``position_perplexity`` from the (documents, length - 1) token losses (every document has
    ``length`` tokens, so each bucket's mean over documents is its mean over tokens)."""
    nll = torch.as_tensor(nll, dtype=torch.float64)
    means = bucket_means(nll, length).mean(dim=0)
    out = {bucket_name(lo, hi): math.exp(float(m)) for (lo, hi), m in zip(buckets(length), means)}
    out["ppl"] = math.exp(float(nll.mean()))
    out["docs"] = float(len(nll))
    return out
