"""Load a trained model from a Lightning checkpoint, with one clear sentence for every way it can fail."""
from __future__ import annotations

from pathlib import Path

import torch

from ..models import ModelConfig, Transformer, build_model


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[Transformer, dict]:
    """(model in eval mode, info) from a ``cli.py fit`` checkpoint; ``info`` holds the tokenizer name,
    the step and the architecture. Loads with ``weights_only=True``: a checkpoint runs no code."""
    from ..lit.checkpoint import read_checkpoint

    path = Path(path)
    ckpt = read_checkpoint(path, map_location=map_location)
    arch = (ckpt.get("hyper_parameters") or {}).get("arch") if isinstance(ckpt, dict) else None
    if not isinstance(arch, dict) or "state_dict" not in ckpt:
        raise ValueError(f"checkpoint {str(path)!r} is not an sa_lightning checkpoint: it has no model architecture "
                         "(hyper_parameters.arch); evaluate checkpoints written by `cli.py fit`.")
    try:
        cfg = ModelConfig(**arch)
    except (TypeError, ValueError) as err:
        raise ValueError(f"checkpoint {str(path)!r} holds an architecture this version cannot build: {err}") from None
    model = build_model(cfg)
    weights = {k.removeprefix("net."): v for k, v in ckpt["state_dict"].items() if k.startswith("net.")}
    weights = {k.replace("_orig_mod.", ""): v for k, v in weights.items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {str(path)!r} does not match its own architecture: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}.")
    model.eval()
    data = ckpt.get("LMDataModule") or {}
    info = {"path": str(path), "step": ckpt.get("global_step"), "arch": cfg.to_dict(),
            "tokenizer": data.get("tokenizer", "embedded")}
    return model, info
