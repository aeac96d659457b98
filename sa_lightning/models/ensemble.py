"""The one meaning of ``eval_samples`` K: the prediction of K draws of a stochastic attention is the mean of their
next-token **probabilities**, scored by its log (``LitLM.eval_scores`` in validation, ``eval.lm.SALM`` in lm-eval).

Why probabilities. A model whose attention draws (σ for SA, the hash seeds of the random control) is a mixture over
its draws, and the mixture's prediction at a position is (1/K) Σ_s p_s(x): a distribution (it sums to one), whose
log-likelihood, perplexity and argmax are those of the ensemble. The mean of the log-probabilities would be the log
of a geometric mean instead: it sums to less than one, and it lowers every likelihood by a Jensen gap that grows
with the draws' disagreement, so it would charge the model for the very variance that K averages away. As K grows,
log-mean-probability converges to the ensemble's log-likelihood, the mean log-probability to one draw's expected
log-likelihood. Each position is averaged given its context, as validation always did: the mixture of the K
next-token distributions, not of K whole-sequence probabilities.
"""
from __future__ import annotations

import math
from typing import Callable

import torch


def mean_over_draws(logits_of: Callable[[int], torch.Tensor], samples: int) -> torch.Tensor:
    """Scores (..., V) whose softmax is the K-draw prediction: for K = 1 ``logits_of(0)`` as it is (no copy, no
    cast), else log((1/K) Σ_s softmax(logits_of(s))) in float32. ``logits_of(s)`` runs draw s, and each s must
    draw differently (a row's draw index, ``attention.draws.row_key``; or its own stream)."""
    if samples == 1:
        return logits_of(0)
    total = None
    for s in range(samples):
        logp = torch.log_softmax(logits_of(s).float(), dim=-1)
        total = logp if total is None else torch.logaddexp(total, logp)
    return total - math.log(samples)
