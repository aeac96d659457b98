"""The project's one lm-evaluation-harness model (``--model sa_lightning``): lm-eval's ``HFLM`` over an already-built
transformers causal LM that takes an attention mask.

It evaluates
- a checkpoint written by ``cli.py fit`` (its path) or its network: the Transformer++ runs as
  ``SATransformerForCausalLM`` (weights shared, nothing copied), the Qwen3 backbone as its own patched model;
- any transformers causal LM handed over as an object: an exported ``SATransformerForCausalLM``, or a Hugging Face
  model patched by ``models.patcher`` (``inference.lm.PatchedHFLM`` loads and patches one by name).

Scoring (loglikelihood, rolling, multiple choice) is this class's own ``_loglikelihood_tokens``. HFLM's right-pads
each batch with token 0 and calls a causal model without an attention mask: dense causal attention never reads
trailing pads, but SA's permuted window wraps around the whole padded row, so its scores would change with the batch
size (``inference.lm`` once swapped lm-eval's ``pad_and_concat`` to recover the lengths). Here each batch goes to the
model with its padding mask, and the model draws each row's σ from (seed, layer, the row's own tokens, the draw
index) (``attention.draws``), so a score depends on nothing but its own request; nothing of lm-eval is replaced.
Tokenization, rolling windows and ``generate_until`` are HFLM's: generation is batched, left-padded and decoded by
the model's own ``generate`` with its KV cache (``models.hf_model``; draw 0).

SA modes (a checkpoint or a network; a model handed over as an object draws as its config or patch says):
- ``stochastic`` (the paper's default): every sequence draws its own permutations.
- ``deterministic``: one fixed permutation per (layer, length), shared by every input.
A model trained with a fixed σ (``permutation: deterministic``, fixed-σ SA) keeps the one it trained with in either.

``eval_samples=K`` (beyond the paper; it lowers the variance that the random routing adds to every score): each
next-token prediction is the mean of K draws' probabilities, as validation's is (``models.ensemble`` says why
probabilities, not log-probabilities). Draw s is the model's ``sa_sample=s``.
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from tqdm import tqdm
from transformers import PreTrainedModel

from ..attention.draws import SA_MODES
from ..models.ensemble import mean_over_draws
from ..models.hf_model import SATransformerForCausalLM
from ..models.patcher import STATE


#: HFLM's two warnings about a model passed in built (every call here builds its own on purpose, in one process)
_BUILT_MODEL_WARNINGS = ("`pretrained` model kwarg is not of type `str`",
                         "Passed an already-initialized model through `pretrained`")


@contextlib.contextmanager
def _built_model_on_purpose():
    """HFLM's constructor without its two warnings for a model passed in built (they advise against accelerate
    launches and ``parallelize``, which this project never uses); every other line of lm-eval's logger stays."""
    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_BUILT_MODEL_WARNINGS)

    log = logging.getLogger("lm_eval.models.huggingface")
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)


@register_model("sa_lightning")
class SALM(HFLM):
    """Args:
        model: a transformers causal LM that takes an attention mask; a ``Transformer`` or a Qwen3 backbone
            (``HFBackbone``); or the path of a checkpoint written by ``cli.py fit``.
        tokenizer: a Hugging Face tokenizer, or a name for ``load_tokenizer``; default: the checkpoint's (else the
            embedded one).
        batch_size: sequences per forward pass (results do not depend on it), or ``auto``.
        device: where the model runs (it is moved there); default: where it is.
        eval_samples: draws averaged per score; a model whose attention draws nothing runs once.
        sa_mode: ``stochastic`` or ``deterministic`` (a checkpoint or a network).
        seed: the permutation seed (a checkpoint or a network).
        max_length: longest scored sequence; default the model's.
        max_gen_toks: default generation budget for ``generate_until``.
        **kwargs: HFLM's (``add_bos_token``, ``mixed_precision_dtype``, ``max_batch_size``, ...). A checkpoint's
            text is scored without special tokens, as training packs it (documents joined by EOS, no BOS).
    """

    def __init__(self, model, tokenizer=None, batch_size: int | str = 16, device: str | None = None,
                 eval_samples: int = 1, sa_mode: str = "stochastic", seed: int = 0, max_length: int | None = None,
                 max_gen_toks: int = 64, **kwargs):
        from ..data.tokenizer import load_tokenizer

        if sa_mode not in SA_MODES:
            raise ValueError(f"sa_mode must be one of {', '.join(SA_MODES)}, got {sa_mode!r}.")
        if int(eval_samples) < 1:
            raise ValueError(f"eval_samples must be >= 1, got {eval_samples}.")
        if isinstance(model, (str, Path)):
            from ..models.checkpoint import load_checkpoint

            model, info = load_checkpoint(model)
            tokenizer = tokenizer or info["tokenizer"]
        if not isinstance(model, PreTrainedModel):  # the project's network: run as a transformers model
            kwargs.setdefault("add_bos_token", False)
            model = causal_lm(model, sa_mode, int(seed))
        if tokenizer is None or isinstance(tokenizer, str):
            tokenizer = load_tokenizer(tokenizer or "embedded")
        vocab = model.get_output_embeddings().weight.shape[0]
        if len(tokenizer) > vocab:
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab is {vocab}; evaluate "
                             "with the tokenizer the model was trained with.")
        if device is not None and torch.device(device) != model.device:
            model.to(device)
        with _built_model_on_purpose():
            super().__init__(pretrained=model, tokenizer=tokenizer, backend="causal", batch_size=batch_size,
                             max_length=max_length, **kwargs)
        self._eval_samples = int(eval_samples)
        self._max_gen_toks = int(max_gen_toks)

    @property
    def eval_samples(self) -> int:
        """Draws averaged per score: 1 when the model's attention draws nothing (read per call: a sweep patches
        one model with one mode after another)."""
        return self._eval_samples if draws_per_input(self.model) else 1

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @torch.no_grad()
    def log_probs(self, rows: list[list[int]], first: int) -> torch.Tensor:
        """Next-token log-probabilities (B, n - first, V) at positions first..n-1 of ``rows`` right-padded to n,
        the mean of ``eval_samples`` draws' probabilities; the LM head runs only on those positions."""
        n = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), n), dtype=torch.long)  # any id: padding is masked
        mask = torch.zeros_like(ids)
        for b, row in enumerate(rows):
            ids[b, :len(row)] = torch.tensor(row, dtype=torch.long)
            mask[b, :len(row)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        samples = self.eval_samples

        def logits_of(sample: int) -> torch.Tensor:
            draw = {"sa_sample": sample} if samples > 1 else {}
            with torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                                enabled=self.mixed_precision_dtype is not None):
                return self.model(input_ids=ids, attention_mask=mask, logits_to_keep=n - first, use_cache=False,
                                  **draw).logits

        return torch.log_softmax(mean_over_draws(logits_of, samples).float(), dim=-1)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None
                              ) -> list[tuple[float, bool]]:
        """Sum of log p(continuation | context) and whether it is the greedy continuation, per request. Requests
        with the same input row (multiple choice with one-token answers) share one scored row, as in HFLM."""
        rows: dict[tuple, list] = {}  # input row -> its requests (index, continuation)
        for i, (_, context, continuation) in enumerate(requests):
            if len(continuation) > self.max_length:
                raise ValueError(f"a continuation of {len(continuation)} tokens exceeds max_length={self.max_length}.")
            whole = (context + continuation)[-(self.max_length + 1):]
            rows.setdefault(tuple(whole[:-1]), []).append((i, whole[-len(continuation):]))
        order = sorted(rows, key=len, reverse=True)  # similar lengths share a batch: little padding
        size = override_bs or (self._detect_batch_size() if self.batch_size == "auto" else self.batch_size)
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), desc="Scoring", disable=disable_tqdm)
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            first = min(len(row) - len(cont) for row in chunk for _, cont in rows[row])
            for row, lp in zip(chunk, self.log_probs([list(row) for row in chunk], first)):
                for i, cont in rows[row]:
                    begin = len(row) - len(cont) - first
                    span, target = lp[begin:begin + len(cont)], torch.tensor(cont, device=lp.device)
                    ll = span.gather(-1, target.view(-1, 1)).sum().item()
                    results[i] = (ll, bool((span.argmax(-1) == target).all()))
                    if requests[i][0] is not None:
                        self.cache_hook.add_partial("loglikelihood", requests[i][0], results[i])
                bar.update(len(rows[row]))
        bar.close()
        return results

def causal_lm(net, sa_mode: str, seed: int):
    """A checkpoint's network as a transformers causal LM that decodes with a KV cache (weights shared, nothing
    copied): ``SATransformerForCausalLM`` around the Transformer++, or the Qwen3 backbone's own patched model."""
    if hasattr(net, "for_evaluation"):
        return net.for_evaluation(seed)
    return SATransformerForCausalLM.from_transformer(net, sa_mode=sa_mode, sa_seed=seed).eval()


def draws_per_input(model) -> bool:
    """Whether ``model``'s attention draws per input (σ, a key table): an ``SATransformerForCausalLM`` of such a
    variant, or a Hugging Face model patched with one."""
    if isinstance(model, SATransformerForCausalLM):
        return model.model.variant.draws
    state = model.__dict__.get(STATE)
    return state is not None and state.spec.draws
