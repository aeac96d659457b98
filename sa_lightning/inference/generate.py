"""``python cli.py generate``: text from a trained checkpoint or a Hugging Face model, streamed to stdout.

    python cli.py generate --ckpt runs/tiny/tb/version_0/checkpoints/last.ckpt --prompt "ROMEO:"
    python cli.py generate --model outputs/hf_tiny --prompt_file prompts.txt --temperature 0.8 --top_p 0.95

A checkpoint's Transformer++ runs as ``SATransformerForCausalLM``: the prompt is prefilled through its
variant, and each new token reads the KV cache (``--decode dense``, or ``window`` for the SWA path).
``--model`` takes an exported folder, a local Hugging Face folder, a Hub id, or a fetched name
(``smollm2``). ``--temperature 0`` (the default) is greedy; above 0 it samples, with ``--top_p``.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ..utils.stats import derived_seed
from ..utils.argtypes import doc_help


def _parser() -> argparse.ArgumentParser:
    from ..models.hf_config import DECODE

    p = argparse.ArgumentParser(prog="cli.py generate", **doc_help(__doc__))
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpt", help="a checkpoint written by `cli.py fit`")
    source.add_argument("--model", help="an exported or Hugging Face folder, a Hub id, or a fetched name (smollm2)")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the text to continue")
    prompt.add_argument("--prompt_file", help="a text file with one prompt per line (blank lines skipped)")
    p.add_argument("--max_new_tokens", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above 0: sampling at this temperature")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling mass, in (0, 1]")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the sampling (each prompt of a file its own draw from the seed and its line) and SA's "
                        "sigma")
    p.add_argument("--decode", choices=DECODE, default=None,
                   help="Transformer++ only: every cached key (dense, the default) or the SWA path's last w (window)")
    p.add_argument("--device", default=None, help="where to run (cpu, cuda, cuda:1) (default: cuda when available, else cpu)")
    return p


def _check(args) -> list[str]:
    if not (args.temperature >= 0 and math.isfinite(args.temperature)):  # nan and inf too, not greedy in silence
        raise ValueError(f"--temperature must be a finite number >= 0 (0 is greedy), got {args.temperature}.")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top_p must be in (0, 1], got {args.top_p}.")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {args.max_new_tokens}.")
    if args.device is not None:
        from ..utils.device import check_device

        check_device(args.device)
    if args.model is not None:
        _check_model(args.model)
    if args.prompt is not None:
        return [args.prompt]
    path = Path(args.prompt_file).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"--prompt_file {str(path)!r} is a folder; pass a text file in it, with one prompt "
                                "per line.")
    if not path.is_file():
        raise FileNotFoundError(f"--prompt_file {str(path)!r} does not exist.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"--prompt_file {str(path)!r} is not UTF-8 text (byte {err.start}: {err.reason}); save it "
                         "as UTF-8, with one prompt per line.") from None
    prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"--prompt_file {str(path)!r} holds no prompt (one per line).")
    return prompts


def _check_model(text: str) -> None:
    """``--model`` that cannot be a model, named before anything loads: a path that does not exist, a folder
    without a model's ``config.json``, a checkpoint file (that is ``--ckpt``'s). Hub ids and fetched names
    (``smollm2``) pass on to the loader."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from ..models.sources import FETCHABLE

    path = Path(text).expanduser()
    if text in FETCHABLE or path.suffix.lower() == ".gguf":  # the loader names a missing or unfetched one
        return
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"--model {text!r} is a folder but not a model: it holds no config.json (an exported "
                             "or Hugging Face model folder has one); pass the folder `cli.py export` wrote, or a "
                             "checkpoint with --ckpt.")
        return
    if path.is_file():
        if path.suffix == ".ckpt":
            raise ValueError(f"--model {text!r} is a checkpoint file, not a model folder; pass it with --ckpt instead.")
        raise ValueError(f"--model {text!r} is a file, not a model folder; pass a folder holding config.json, a Hub "
                         "id or a .gguf file.")
    try:
        validate_repo_id(text)
    except HFValidationError:  # no Hub id looks like this: it was meant as a path
        raise FileNotFoundError(f"--model {text!r} does not exist; pass an exported or Hugging Face model folder, "
                                "a Hub id or a fetched name (smollm2).") from None


def load(args):
    """(causal LM in eval mode, tokenizer, whether to add special tokens) for ``--ckpt`` or ``--model``."""
    from ..models import sources
    from ..models.hf_config import SATransformerConfig

    if args.ckpt:
        from ..data.tokenizer import load_tokenizer
        from ..models.checkpoint import load_checkpoint
        from ..models.hf_model import SATransformerForCausalLM

        net, info = load_checkpoint(args.ckpt)
        tokenizer = load_tokenizer(info["tokenizer"])
        if hasattr(net, "hf"):  # the Qwen3 backbone: its own (patched) transformers model
            if args.decode == "window":
                raise ValueError("--decode window applies to the Transformer++; a backbone: qwen3 model decodes densely.")
            return net.hf.eval(), tokenizer, False
        return SATransformerForCausalLM.from_transformer(net, decode=args.decode or "dense", sa_seed=args.seed).eval(), \
            tokenizer, False  # training packs documents with no BOS
    source = sources.resolve(args.model)
    try:
        model = sources.load_causal_lm(source, "float32")
    except OSError as err:  # a Hub id (it looks like one) that is not in the cache, or offline
        if source.path != args.model or Path(args.model).expanduser().exists():
            raise
        import os

        why = "it is not in the local cache, and HF_HUB_OFFLINE=1 keeps the Hub from being asked" \
            if os.environ.get("HF_HUB_OFFLINE") == "1" else \
            f"the Hub has no such model or cannot be reached ({str(err).splitlines()[0][:160]})"
        raise ValueError(f"--model {args.model!r} is not a local folder (no such path), and as a Hub id {why}; "
                         "pass an exported model folder, or a checkpoint with --ckpt.") from None
    if isinstance(model.config, SATransformerConfig):
        from ..models.hf_config import check_decode

        check_decode(model.config.attention["variant"], args.decode or model.config.decode)
        model.config.decode = args.decode or model.config.decode
        model.config.sa_seed = args.seed
        special = False
    elif args.decode is not None:
        raise ValueError("--decode applies to sa_lightning's Transformer++, not to "
                         f"{type(model).__name__}.")
    else:
        special = True
    return model, sources.tokenizer_for(source), special


def main(argv: list[str] | None = None) -> list[str]:
    import torch
    from transformers import TextStreamer

    args = _parser().parse_args(argv)
    prompts = _check(args)
    model, tokenizer, special = load(args)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    limit = getattr(model.config, "max_position_embeddings", None)
    texts = []
    for i, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=special).input_ids.to(device)
        if ids.shape[1] == 0:
            raise ValueError(f"prompt {i + 1} is empty after tokenization.")
        if limit is not None and ids.shape[1] >= limit:
            raise ValueError(f"prompt {i + 1} is {ids.shape[1]} tokens, and the model's max_seq_len is {limit}: "
                             "it leaves no room for a new token; shorten it.")
        budget = args.max_new_tokens if limit is None else min(args.max_new_tokens, limit - ids.shape[1])
        if budget < args.max_new_tokens:
            print(f"[prompt {i + 1}: {budget} new tokens reach max_seq_len={limit}]", file=sys.stderr, flush=True)
        # each prompt its own draw, from (--seed, its line): a file's prompts are not sampled alike, and a rerun of
        # the file gives every prompt its same continuation
        torch.manual_seed(derived_seed(args.seed, "prompt", i))
        sampling = {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p} \
            if args.temperature > 0 else {"do_sample": False}
        print(prompt, end="", flush=True)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                             pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                             else tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                             streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True), **sampling)
        texts.append(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
        if i + 1 < len(prompts):
            print(flush=True)
    return texts
