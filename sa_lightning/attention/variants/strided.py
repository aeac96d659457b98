"""The strided control: query i reads every earlier key j with (i - j) mod s = 0, s = ceil((n - 1) /
(2 * ceil(w/2) - 2)) for the row's n valid tokens. Deterministic and spread evenly over the whole past, it reads
about SA's expected number of keys at every position: SA against it asks whether the permutation's randomness
matters, or only that the keys reach far (Sparse Transformer's strided pattern, at SA's budget)."""
from __future__ import annotations

import torch

from .. import masks, oracle
from ..registry import Variant
from ..strided import stride, strided_attention
from ._common import dense_with_lse


def mask(spec, n, perm=None, lengths=None):
    return masks.strided(spec.window, n, lengths)


def kernel_with_lse(call):
    if call.backend == "dense":
        return dense_with_lse(call, mask(call.spec, call.q.shape[2], None, call.lengths))
    return strided_attention(call.q, call.k, call.v, call.window, scale=call.scale, lengths=call.lengths,
                             validate=False)  # checked by the call


def keys_attended_row(spec, length, row=None):
    """Query i reads floor(i / s) + 1 keys."""
    s = stride(length, spec.window)
    return int((torch.arange(length) // s + 1).sum())


VARIANT = STRIDED = Variant(
    name="strided", label="Strided", color="#8E44AD", marker="p", paths=("strided",),
    kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.strided_mask(q.shape[2], spec.window, q.shape[0], lengths,
                                                                     q.device),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: -(-n // stride(n, spec.window)),  # its group's keys, all of them
    windowed=True, min_window=3,
    fused_below=None,  # its own kernel is as fast at n = 128 (6.7 ms against 8.1) and faster beyond
    description="control: every s-th earlier key, s spreading SA's budget evenly over the row",
)
