"""An lm-evaluation-harness model for sa_lightning checkpoints (``--model sa_lightning``).

Batched and padding-correct: sequences are right-padded and every row carries its length, so SA
permutes only the row's own tokens and never reads a pad. Each row's permutations are drawn from
(seed, sample, the row's tokens, layer), which makes results reproducible and independent of the
batch size and of what else is in the batch.

SA modes:
- ``stochastic`` (the paper's default): every sequence draws its own permutations.
- ``deterministic``: one fixed permutation per (layer, length), shared by every input.

``eval_samples=K`` averages the per-token log-probabilities over K independent permutation draws
(beyond the paper; it lowers the variance that the random routing adds to every score).
"""
from __future__ import annotations

from pathlib import Path

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from ..attention.draws import SA_MODES
from ..models import Transformer


@register_model("sa_lightning")
class SALM(TemplateLM):
    """Args:
        model: a ``Transformer``, or the path of a checkpoint written by ``cli.py fit``.
        tokenizer: a Hugging Face tokenizer, or a name for ``load_tokenizer``; default: the checkpoint's.
        batch_size: sequences per forward pass (results do not depend on it).
        eval_samples: permutation draws averaged per score (SA variants only).
        sa_mode: ``stochastic`` or ``deterministic``.
        seed: the permutation seed.
        max_length: longest scored sequence; default the model's max_seq_len.
        max_gen_toks: default generation budget for ``generate_until``.
        max_batch_size: accepted for lm-eval's CLI, which always passes it; batches are ``batch_size``.
    """

    def __init__(self, model: Transformer | str, tokenizer=None, batch_size: int | str = 16,
                 device: str | None = None, eval_samples: int = 1, sa_mode: str = "stochastic", seed: int = 0,
                 max_length: int | None = None, max_gen_toks: int = 64, max_batch_size: int | None = None):
        super().__init__()
        from ..data.tokenizer import load_tokenizer

        if isinstance(model, (str, Path)):
            from ..models.checkpoint import load_checkpoint

            model, info = load_checkpoint(model)
            tokenizer = tokenizer or info["tokenizer"]
        if sa_mode not in SA_MODES:
            raise ValueError(f"sa_mode must be one of {', '.join(SA_MODES)}, got {sa_mode!r}.")
        if int(eval_samples) < 1:
            raise ValueError(f"eval_samples must be >= 1, got {eval_samples}.")
        self.tokenizer = load_tokenizer(tokenizer or "embedded") if tokenizer is None or isinstance(tokenizer, str) \
            else tokenizer
        if len(self.tokenizer) > model.cfg.vocab_size:
            raise ValueError(f"the tokenizer has {len(self.tokenizer)} tokens but the model's vocab is "
                             f"{model.cfg.vocab_size}; evaluate with the tokenizer the model was trained with.")
        self.model = model.eval()
        if device is not None:
            self.model.to(device)
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 16
        self.eval_samples = int(eval_samples) if model.variant.draws else 1
        self.sa_mode, self.seed = sa_mode, int(seed)
        self.max_length = int(max_length or model.cfg.max_seq_len)
        self.max_gen_toks = int(max_gen_toks)

    # ---- TemplateLM plumbing -------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # Training packs documents joined by EOS with no BOS, so scoring adds no special tokens either.
        return self.tokenizer.encode(string, add_special_tokens=False)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens)

    # ---- the forward pass ----------------------------------------------------------------------
    def _draws(self, rows: list[list[int]], n: int, sample: int) -> list[torch.Tensor] | None:
        """Per layer, the draw (σ, a key table) of each row's own valid tokens, its padding kept in place."""
        return self.model.row_draws(rows, n, seed=self.seed, mode=self.sa_mode, sample=sample, device=self.device)

    @torch.no_grad()
    def span_log_probs(self, rows: list[list[int]], spans: list[tuple[int, int]]) -> list[torch.Tensor]:
        """Per row, the next-token log-probabilities (end - start, vocab) at positions start..end-1 of the
        right-padded ``rows``, averaged over ``eval_samples`` permutation draws. The LM head runs only
        on those positions."""
        n = max(len(r) for r in rows)
        idx = torch.full((len(rows), n), self.eot_token_id, dtype=torch.long)
        for b, row in enumerate(rows):
            idx[b, :len(row)] = torch.tensor(row, dtype=torch.long)
        idx = idx.to(self.device)
        lengths = torch.tensor([len(r) for r in rows], device=self.device)
        totals: list[torch.Tensor] = []
        for sample in range(self.eval_samples):
            # perm_stream reaches backbones that draw their own per-row permutations (the HF backbone)
            hidden = self.model.features(idx, perms=self._draws(rows, n, sample), lengths=lengths,
                                         perm_stream=-1 - (self.seed * 1009 + sample))
            for b, (start, end) in enumerate(spans):
                lp = torch.log_softmax(self.model.lm_head(hidden[b, start:end]).float(), dim=-1)
                totals.append(lp) if sample == 0 else totals[b].add_(lp)
        return [t / self.eval_samples for t in totals]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """Sum of log p(continuation | context) and whether it is the greedy continuation, per request."""
        work = []
        for i, (_, context, continuation) in enumerate(requests):
            if len(continuation) > self.max_length:
                raise ValueError(f"a continuation of {len(continuation)} tokens exceeds max_length={self.max_length}.")
            whole = (context + continuation)[-(self.max_length + 1):]
            work.append((i, whole[:-1], whole[-len(continuation):]))
        work.sort(key=lambda w: -len(w[1]))  # similar lengths share a batch: little padding
        results: list[tuple[float, bool] | None] = [None] * len(work)
        bar = tqdm(total=len(work), desc="Scoring", disable=disable_tqdm)
        for start in range(0, len(work), self.batch_size):
            chunk = work[start:start + self.batch_size]
            spans = [(len(inp) - len(cont), len(inp)) for _, inp, cont in chunk]
            for (i, _, cont), lp in zip(chunk, self.span_log_probs([w[1] for w in chunk], spans)):
                target = torch.tensor(cont, device=lp.device)
                ll = lp.gather(-1, target.view(-1, 1)).sum().item()
                greedy = bool((lp.argmax(-1) == target).all())
                results[i] = (ll, greedy)
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], (ll, greedy))
            bar.update(len(chunk))
        bar.close()
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Whole-document log-likelihood in disjoint windows of max_length tokens (as HFLM does)."""
        windows, owner = [], []
        for doc, req in enumerate(requests):
            tokens = self.tok_encode(req.args[0])
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(doc)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for doc, (ll, _) in zip(owner, scores):
            totals[doc] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def causal_lm(self):
        """The model as a transformers causal LM that decodes with a KV cache (weights shared, nothing copied):
        ``SATransformerForCausalLM`` around the Transformer++ (sigma drawn as scoring draws it), or the Qwen3
        backbone's own patched model."""
        if getattr(self, "_causal_lm", None) is None:
            from ..models.hf_model import SATransformerForCausalLM

            self._causal_lm = self.model.hf if hasattr(self.model, "hf") else \
                SATransformerForCausalLM.from_transformer(self.model, sa_mode=self.sa_mode, sa_seed=self.seed).eval()
        return self._causal_lm

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding until a stop string, EOS or ``max_gen_toks``, with a KV cache: the context is
        prefilled once through the variant, each new token reads the cache (``models.hf_model``)."""
        from ..models.hf_cache import CACHE, cache_of

        lm, out = self.causal_lm(), []
        for req in tqdm(requests, desc="Generating", disable=disable_tqdm):
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = min(int(kwargs.get("max_gen_toks", self.max_gen_toks)), self.max_length - 1)
            tokens = self.tok_encode(context)[-(self.max_length - budget):] or [self.prefix_token_id]
            step = lm(torch.tensor([tokens], device=self.device), use_cache=True)
            new: list[int] = []
            text = ""
            for _ in range(budget):
                nxt = int(step.logits[0, -1].argmax())
                if nxt == self.eot_token_id:
                    break
                new.append(nxt)
                text = self.tok_decode(new)
                if any(stop in text for stop in until) or len(new) == budget:
                    break
                step = lm(torch.tensor([[nxt]], device=self.device), use_cache=True, **{CACHE: cache_of(step)})
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out
