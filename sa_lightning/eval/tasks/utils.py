"""Loaders and scorers for the offline tasks; lm-eval imports this file through ``!function``.

The data sit next to this file, so the tasks load from any working directory and never touch the
network (``custom_dataset`` replaces ``datasets.load_dataset``).
"""
import json
import re
from pathlib import Path

DATA = Path(__file__).parent / "data"


def _load(name):
    from datasets import Dataset, DatasetDict

    with open(DATA / f"{name}.jsonl", encoding="utf-8") as f:
        return DatasetDict({"test": Dataset.from_list([json.loads(line) for line in f])})


def load_rolling(**kwargs):
    return _load("shakespeare_rolling")


def load_lastword(**kwargs):
    return _load("shakespeare_lastword")


def load_choice(**kwargs):
    return _load("shakespeare_choice")


def rolling_results(doc, results):
    """As wikitext: word and byte perplexity, weighted by the document's own counts."""
    (loglikelihood,) = results
    words = len(re.split(r"\s+", doc["page"].strip()))
    size = len(doc["page"].encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, size),
        "bits_per_byte": (loglikelihood, size),
    }
