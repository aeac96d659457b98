"""Tokenizers: any Hugging Face name or path, or the embedded byte-level BPE that ships with the package.

``load_tokenizer("embedded")`` needs no network: the tokenizer was trained on the embedded corpus's
train split by ``train_embedded_tokenizer`` (rebuild it with ``scripts/build_embedded_tokenizer.py``).
Anything else goes to ``transformers.AutoTokenizer``, so the paper's ``mistralai/Mistral-7B-v0.1``
works for users with a network (or a local copy).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

EMBEDDED = "embedded"
EMBEDDED_FILE = Path(__file__).parent / "embedded" / "tokenizer.json"
EOS = "<|endoftext|>"
EMBEDDED_VOCAB = 4096


def train_embedded_tokenizer(texts: Iterable[str], vocab_size: int = EMBEDDED_VOCAB):
    """Train the byte-level BPE deterministically (fixed input order, one thread)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.environ["RAYON_NUM_THREADS"] = "1"  # merge ties resolve the same way on every machine
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def load_tokenizer(name_or_path: str = EMBEDDED):
    """A ``PreTrainedTokenizerFast`` with an ``eos_token_id``; clear errors for unknown or offline names."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if name_or_path == EMBEDDED:
        return PreTrainedTokenizerFast(tokenizer_file=str(EMBEDDED_FILE), eos_token=EOS, pad_token=EOS)
    path = Path(name_or_path).expanduser()
    _check_local(str(name_or_path), path)
    if path.suffix == ".json" and path.is_file():
        tok = PreTrainedTokenizerFast(tokenizer_file=str(path))
        eos = next((t for t in (EOS, "</s>", "<eos>") if tok.convert_tokens_to_ids(t) not in (None, tok.unk_token_id)
                    and t in tok.get_vocab()), None)
        if eos is None:
            raise ValueError(f"tokenizer file {str(path)!r} has no EOS token ({EOS}, </s> or <eos>), which packing "
                             "needs to separate documents.")
        tok.eos_token = tok.pad_token = eos
        return tok
    try:
        tok = AutoTokenizer.from_pretrained(str(path) if path.exists() else name_or_path)
    except OSError as err:
        if path.exists():  # a local folder with tokenizer files that do not load
            raise ValueError(f"tokenizer {name_or_path!r} cannot be loaded: "
                             f"{str(err).splitlines()[0] if str(err) else type(err).__name__}.") from None
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        why = "there is no such local path, and as a Hub id it is not in the local cache while the Hub is offline " \
            "(HF_HUB_OFFLINE=1)" if offline else "it is neither a local tokenizer folder nor a reachable Hub repo"
        raise ValueError(
            f"tokenizer {name_or_path!r} cannot be loaded: {why}; use tokenizer: embedded, or a local path."
        ) from err
    if tok.eos_token_id is None:
        raise ValueError(f"tokenizer {name_or_path!r} has no EOS token, which packing needs to separate documents.")
    return tok


#: files one of which a tokenizer folder holds (fast, slow BPE/WordPiece and SentencePiece tokenizers)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")


def _check_local(name: str, path: Path) -> None:
    """A tokenizer named by a path: one that does not exist, a folder without a tokenizer, or a file that is not
    a ``tokenizer.json`` is refused in one sentence naming that; a Hub id goes on to ``AutoTokenizer``."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if path.is_dir():
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise ValueError(f"tokenizer {name!r} is a folder without a tokenizer (no tokenizer.json, "
                             "tokenizer_config.json or vocabulary file); pass an exported model folder, a "
                             "tokenizer.json file, or tokenizer: embedded.")
        return
    if path.is_file():
        if path.suffix != ".json":
            raise ValueError(f"tokenizer {name!r} is a file but not a tokenizer.json; pass a tokenizer.json file, a "
                             "tokenizer folder, or tokenizer: embedded.")
        return
    try:
        validate_repo_id(name)
        looks_local = path.suffix == ".json"  # a valid repo id too, but meant as a tokenizer.json file
    except HFValidationError:  # no Hub id looks like this: it was meant as a path
        looks_local = True
    if looks_local:
        raise FileNotFoundError(f"tokenizer {name!r} does not exist; pass an existing tokenizer.json file or "
                                "tokenizer folder, a Hub id, or tokenizer: embedded.")


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens, in one call of the fast (Rust) tokenizer."""
    return [e.ids for e in tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
