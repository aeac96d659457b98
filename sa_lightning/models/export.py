"""``python cli.py export --ckpt CKPT --out DIR``: a ``cli.py fit`` checkpoint as a Hugging Face folder.

The Transformer++ becomes ``SATransformerForCausalLM`` (``config.json``, ``model.safetensors``, the tokenizer,
a model card). ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it after
``sa_lightning.register_with_transformers()``, offline; ``trust_remote_code=True`` loads it without that call,
through a two-line module in the folder that imports sa_lightning. A ``backbone: qwen3`` model becomes a plain Qwen3 folder, which needs no sa_lightning at all.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..utils.argtypes import doc_help

#: the module in an exported folder that ``trust_remote_code=True`` runs: it only imports sa_lightning
REMOTE_MODULE = "sa_lightning_remote"
REMOTE_CODE = '''"""The model of this folder is sa_lightning's Transformer++ (written by `cli.py export`). Its code is
the sa_lightning package: `pip install` it, then call `sa_lightning.register_with_transformers()` before
from_pretrained (or pass trust_remote_code=True, which runs this file)."""
from sa_lightning.models.hf_config import SATransformerConfig  # noqa: F401
from sa_lightning.models.hf_model import SATransformerForCausalLM  # noqa: F401
'''
CARD = """---
library_name: transformers
tags: [sa_lightning, stochastic-attention]
---
# {name}

A Transformer++ trained with sa_lightning (attention: {variant}, window {window}), exported from
`{ckpt}` at step {step}.

```python
import sa_lightning
from transformers import AutoModelForCausalLM, AutoTokenizer

sa_lightning.register_with_transformers()  # the model's classes, for transformers' Auto classes
model = AutoModelForCausalLM.from_pretrained("{name}")
tokenizer = AutoTokenizer.from_pretrained("{name}")
```

Without that call, pass `trust_remote_code=True` (it runs `{module}.py`, which imports
sa_lightning). Prefill runs the trained variant; decoding reads the whole cache (`decode: dense`) or, for
the SWA path, the last w keys (`decode: window`).
"""


def export(model, folder: str | Path, tokenizer=None, source: dict | None = None, overwrite: bool = False,
           inputs=(), owner: str | None = "export", **inference) -> Path:
    """Writes ``model`` (a ``Transformer``, an ``SATransformerForCausalLM`` or the Qwen3 ``HFBackbone``) and
    ``tokenizer`` to ``folder``. ``inference`` sets ``decode``, ``sa_mode`` and ``sa_seed``.

    The folder is built beside ``folder`` and renamed into place when whole: a failure (a full disk) leaves
    the previous folder as it was. A folder that already holds files is replaced only with ``overwrite``, and
    then only when an earlier export wrote it and it holds none of ``inputs`` and no checkpoint."""
    from ..utils.atomic import replacing_folder

    folder = Path(folder)
    with replacing_folder(folder, "exported model", overwrite=overwrite, inputs=inputs, owner=owner) as tmp:
        _write(model, tmp, tokenizer, source, folder, **inference)
    return folder


def _write(model, folder: Path, tokenizer, source: dict | None, final: Path, **inference) -> None:
    from .hf_model import SATransformerForCausalLM
    from .transformer import Transformer

    if hasattr(model, "save_pretrained") and not isinstance(model, SATransformerForCausalLM):
        model.save_pretrained(folder, tokenizer)  # the Qwen3 backbone: a plain transformers folder
        return
    if isinstance(model, Transformer):
        model = SATransformerForCausalLM.from_transformer(model, **inference)
    model.config.auto_map = {"AutoConfig": f"{REMOTE_MODULE}.SATransformerConfig",
                             "AutoModelForCausalLM": f"{REMOTE_MODULE}.SATransformerForCausalLM"}
    if tokenizer is not None:
        model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.config.pad_token_id = model.generation_config.pad_token_id = tokenizer.pad_token_id \
            if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model.save_pretrained(folder)
    (folder / f"{REMOTE_MODULE}.py").write_text(REMOTE_CODE)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    attention = model.config.attention
    source = source or {}
    (folder / "README.md").write_text(CARD.format(name=final.resolve(), variant=attention["variant"],
                                                  window=attention["window"], ckpt=source.get("path", "memory"),
                                                  step=source.get("step"), module=REMOTE_MODULE))


def main(argv: list[str] | None = None) -> Path:
    from ..data.tokenizer import load_tokenizer
    from .checkpoint import load_checkpoint
    from .hf_config import DECODE

    parser = argparse.ArgumentParser(prog="cli.py export", **doc_help(__doc__))
    parser.add_argument("--ckpt", required=True, help="a checkpoint written by `cli.py fit`")
    parser.add_argument("--out", required=True, help="the folder to write (built beside it, then renamed into place)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out when an earlier export wrote it (never a folder holding the checkpoint, "
                             "any checkpoint, or files export did not write)")
    parser.add_argument("--decode", choices=DECODE, default="dense",
                        help="how generation reads the cache: every key (dense) or the SWA path's last w (window)")
    parser.add_argument("--tokenizer", default=None,
                        help="the tokenizer to ship in the folder (default: the one the checkpoint was trained with)")
    args = parser.parse_args(argv)
    from ..utils.atomic import check_replaceable_folder

    check_replaceable_folder(args.out, args.overwrite, inputs=[args.ckpt], owner="export")  # before it is read
    model, info = load_checkpoint(args.ckpt)
    tokenizer = load_tokenizer(args.tokenizer or info["tokenizer"])
    folder = export(model, args.out, tokenizer, source=info, overwrite=args.overwrite, inputs=[args.ckpt],
                    decode=args.decode)
    print(f"exported {args.ckpt} (step {info['step']}) to {folder}; load it with "
          f"`sa_lightning.register_with_transformers()` and AutoModelForCausalLM.from_pretrained({str(folder)!r})", flush=True)
    return folder
