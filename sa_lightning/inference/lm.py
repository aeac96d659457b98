"""An lm-eval ``HFLM`` that gives the model its padding mask, and patches its prefill attention.

lm-eval's HFLM right-pads each loglikelihood batch with token 0 and calls the model without an
attention mask. Dense causal attention never reads those trailing pads, so it does not matter
there; SA does read them (its permuted window wraps around the whole padded row), and the scores
would then change with the batch size. ``PatchedHFLM`` records each row's real length as HFLM
batches it and passes the matching ``attention_mask``, so the patcher permutes only real tokens.

Registered as ``sa_lightning_hf``: ``model_args="pretrained=Qwen/Qwen3-8B,variant=sa,window=256"``; ``pretrained``
may also be a ``.gguf`` file or ``smollm2`` once fetched (``models.sources``), which load through the
project's one ``from_pretrained`` path (HFLM itself would not hand ``gguf_file`` to the tokenizer).
"""
from __future__ import annotations

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ..attention.variants import FULL
from ..models.patcher import PatchSpec, patch


@register_model("sa_lightning_hf")
class PatchedHFLM(HFLM):
    """Args: HFLM's (``pretrained`` a hub id, a local path, a .gguf file, ``smollm2`` or a loaded model;
    ``trust_remote_code`` stays False unless given), plus the patch: ``variant``, ``window``, ``block_size``,
    ``top_k``, ``seed``, ``sink``."""

    def __init__(self, pretrained, variant: str = FULL.name, window: int | None = None, block_size: int = 64,
                 top_k: int = 2, seed: int = 0, sink: int = 0, **kwargs):
        spec = PatchSpec(variant, None if window in (None, "None") else int(window), int(block_size), int(top_k),
                         seed=int(seed), sink=int(sink))
        kwargs.setdefault("trust_remote_code", False)
        if isinstance(pretrained, str):
            pretrained, kwargs = _gguf_loaded(pretrained, kwargs)
        super().__init__(pretrained=pretrained, **kwargs)
        self.spec = spec
        self._row_lengths: list[int] | None = None
        patch(self.model, spec)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        import lm_eval.models.huggingface as hf

        original = hf.pad_and_concat

        def recording(max_length, tensors, padding_side="right"):
            if padding_side == "right":
                self._row_lengths = [int(t.shape[-1]) for t in tensors]
            return original(max_length, tensors, padding_side=padding_side)

        hf.pad_and_concat = recording
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        finally:
            hf.pad_and_concat = original
            self._row_lengths = None

    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None) -> torch.Tensor:
        lengths, self._row_lengths = self._row_lengths, None
        if attn_mask is not None or labels is not None or lengths is None or len(lengths) != inps.shape[0]:
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        positions = torch.arange(inps.shape[1], device=inps.device)
        mask = (positions.view(1, -1) < torch.tensor(lengths, device=inps.device).view(-1, 1)).long()
        with torch.no_grad(), torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                             enabled=self.mixed_precision_dtype is not None):
            return self.model(inps, attention_mask=mask).logits


def _gguf_loaded(pretrained: str, kwargs: dict):
    """A GGUF source loaded here (model and tokenizer), for HFLM to take as objects; any other name unchanged."""
    from ..models.sources import load_causal_lm, resolve, tokenizer_for

    source = resolve(pretrained)
    if not source.gguf_file:
        return pretrained, kwargs
    # HFLM ignores device and dtype for a model handed in as an object, so they are applied here
    model = load_causal_lm(source, kwargs.pop("dtype", "auto"), device_map=kwargs.get("device"),
                           trust_remote_code=kwargs["trust_remote_code"])
    kwargs.setdefault("tokenizer", tokenizer_for(source))
    return model, kwargs
