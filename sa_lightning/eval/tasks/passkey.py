"""Pass-key retrieval (a needle in a haystack), built offline and reproducibly; lm-eval imports this file
through ``!function``.

The setting is the classic one of Mohtashami & Jaggi (2023), also RULER's NIAH with its "repeat"
haystack: an instruction says a pass key is hidden in irrelevant text, a few short filler sentences
repeat, one needle sentence carrying a 5-digit key sits at a sentence boundary at a given depth, and a
question ends in an answer prefix, so a greedy model that found the key answers with it at once.

Lengths are in tokens of the tokenizer in use, which reaches ``load`` as lm-eval metadata
(``TaskManager(metadata={"tokenizer": ..., "gguf_file": ...})``, see ``harness.run_tasks``). Without a
``tokenizer`` the prompts are sized by the project's own embedded tokenizer
(``sa_lightning/data/embedded/tokenizer.json``), so pass the model's tokenizer for any other model.
The keys and depths depend only on the task's length and the document's index, never on the
tokenizer, the machine or the run.
"""
import functools
import random
import re
from pathlib import Path

# Not imported from sa_lightning.data: lm-eval loads this file by path, and that package pulls in Lightning.
EMBEDDED_TOKENIZER = Path(__file__).resolve().parents[2] / "data" / "embedded" / "tokenizer.json"
DEPTHS = (0, 25, 50, 75, 100)  # percent of the haystack that comes before the needle
DOCS_PER_DEPTH = 10
MAX_GEN_TOKS = 8  # the YAMLs' max_gen_toks: a 5-digit key and a full stop fit with room to spare
BOS_SLACK = 2  # the prompts are measured without special tokens; a model may add a BOS (or two)

INSTRUCTION = ("Somewhere in the long text below there is a pass key, hidden among sentences that do not "
               "matter. Read the whole text, find the pass key and keep it in mind: you will be asked for it "
               "at the end.")
FILLER = ("The lake is calm today.", "A light wind crosses the fields.", "The road bends toward the hills.",
          "Somewhere a dog barks twice.", "The afternoon goes slowly by.")
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


def build_prompt(key: str, depth: int, sentences: int) -> str:
    """The instruction, ``sentences`` filler sentences with the needle after ``depth`` percent of them,
    and the question."""
    hay = [FILLER[i % len(FILLER)] for i in range(sentences)]
    hay.insert(round(sentences * depth / 100), NEEDLE.format(key=key))
    return f"{INSTRUCTION}\n\n{' '.join(hay)}\n\n{QUESTION}"


@functools.cache
def _tokenizer(name: str | None, gguf_file: str | None):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not name:
        return PreTrainedTokenizerFast(tokenizer_file=str(EMBEDDED_TOKENIZER))
    try:
        return AutoTokenizer.from_pretrained(name, **({"gguf_file": gguf_file} if gguf_file else {}))
    except (OSError, ValueError) as err:
        raise ValueError(f"passkey: the metadata's tokenizer {name!r} (gguf_file={gguf_file!r}) cannot be "
                         f"loaded ({type(err).__name__}: {str(err).splitlines()[0][:160]}); pass a local tokenizer "
                         "folder or a cached Hub id.") from err


def _longest_fitting(fits, guess: int | None = None) -> int:
    """The largest n with fits(n), for a fits that holds up to some n and fails beyond it."""
    if guess is not None:  # a neighbour's answer is off by a sentence or two: walk, a few encodes
        n = guess
        while n > 0 and not fits(n):
            n -= 1
        while fits(n + 1):
            n += 1
        return n
    lo, hi = 0, 1
    while fits(hi):  # grow until one fails, then bisect between the last fit and that failure
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


@functools.cache
def make_docs(length: int, tokenizer: str | None = None, gguf_file: str | None = None) -> tuple[dict, ...]:
    """``len(DEPTHS) * DOCS_PER_DEPTH`` documents whose prompts are as long as fits in ``length`` tokens,
    less the answer's ``MAX_GEN_TOKS`` (HF models cut the prompt's start to make room for them) and a BOS.

    Doc ``i`` has depth ``DEPTHS[i % 5]``, so any prefix of the list (``--limit``) covers the depths evenly.
    Each doc: ``prompt``, ``key`` (5 digits, a string), ``depth`` (percent), ``n_tokens`` (the prompt's,
    without special tokens) and ``sentences`` (filler sentences in its haystack).
    """
    tok = _tokenizer(tokenizer, gguf_file)
    budget = length - MAX_GEN_TOKS - BOS_SLACK

    def count(prompt: str) -> int:
        return len(tok.encode(prompt, add_special_tokens=False))

    docs = []
    for i in range(len(DEPTHS) * DOCS_PER_DEPTH):
        key = str(random.Random(f"passkey/{length}/{i}").randint(10_000, 99_999))
        depth = DEPTHS[i % len(DEPTHS)]
        if count(build_prompt(key, depth, 0)) > budget:
            raise ValueError(f"passkey: a context of {length} tokens cannot hold even the instruction, the "
                             f"needle and the question ({budget} tokens are left for them).")
        # sized per document: the key's digits tokenize differently, and so may the needle's neighbours
        sentences = _longest_fitting(lambda n: count(build_prompt(key, depth, n)) <= budget,
                                     docs[-1]["sentences"] if docs else None)
        prompt = build_prompt(key, depth, sentences)
        docs.append({"prompt": prompt, "key": key, "depth": depth, "n_tokens": count(prompt), "sentences": sentences})
    return tuple(docs)


def load(context_length: int, tokenizer: str | None = None, gguf_file: str | None = None, **metadata):
    """lm-eval's ``custom_dataset``: it is called with the YAML's metadata and the TaskManager's."""
    from datasets import Dataset, DatasetDict

    return DatasetDict({"test": Dataset.from_list(list(make_docs(int(context_length), tokenizer, gguf_file)))})


def first_number(text: str) -> str | None:
    match = re.search(r"\d+", text)
    return match.group() if match else None


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """1 if the generation's first run of digits is the key; reported overall and for the doc's depth."""
    score = float(first_number(results[0]) == doc["key"])
    return {"acc": score, f"acc@d{doc['depth']}": score}
