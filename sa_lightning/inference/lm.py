"""A Hugging Face model with its prefill attention patched, for lm-eval (``--model sa_lightning_hf``).

``PatchedHFLM`` is ``eval.lm.SALM`` (the project's one lm-eval model: scoring with each batch's padding mask,
``eval_samples``, generation through ``generate``) plus what a model named on lm-eval's command line needs: it
loads the model and its tokenizer through the project's one ``from_pretrained`` path (``models.sources``: a Hub id,
a folder, a ``.gguf`` file or ``smollm2`` once fetched) and patches it (``models.patcher``).

``model_args="pretrained=Qwen/Qwen3-8B,variant=sa,window=256"``.
"""
from __future__ import annotations

from lm_eval.api.registry import register_model

from ..attention.variants import FULL
from ..eval.lm import SALM
from ..models.patcher import PatchSpec, patch


@register_model("sa_lightning_hf")
class PatchedHFLM(SALM):
    """Args: ``pretrained`` (a Hub id, a folder, a .gguf file, ``smollm2``, or a loaded transformers model),
    ``dtype`` and ``trust_remote_code`` (False unless given) for loading by name; the patch: ``variant``,
    ``window``, ``block_size``, ``top_k``, ``seed``, ``sa_mode``, ``sink``; the rest is ``SALM``'s."""

    def __init__(self, pretrained, variant: str = FULL.name, window: int | None = None, block_size: int = 64,
                 top_k: int = 2, seed: int = 0, sa_mode: str = "stochastic", sink: int = 0, tokenizer=None,
                 dtype="auto", trust_remote_code: bool = False, **kwargs):
        spec = PatchSpec(variant, None if window in (None, "None") else int(window), int(block_size), int(top_k),
                         seed=int(seed), sa_mode=sa_mode, sink=int(sink))
        model, tokenizer = _loaded(pretrained, tokenizer, dtype, kwargs.get("device"), bool(trust_remote_code))
        patch(model, spec)
        super().__init__(model, tokenizer=tokenizer, **kwargs)


def _loaded(pretrained, tokenizer, dtype, device, trust_remote_code: bool):
    """The model (loaded when ``pretrained`` is a name) and its tokenizer (loaded when not an object)."""
    from ..models import sources

    if isinstance(pretrained, str):
        source = sources.resolve(pretrained)
        model = sources.load_causal_lm(source, dtype, device_map=device, trust_remote_code=trust_remote_code)
    else:
        model, source = pretrained, sources.ModelSource(pretrained.name_or_path)
    if tokenizer is None or isinstance(tokenizer, str):
        tokenizer = sources.tokenizer_for(source, tokenizer, trust_remote_code=trust_remote_code)
    return model, tokenizer
