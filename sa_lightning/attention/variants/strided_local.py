"""The strided control with a local band (Sparse Transformer's strided pattern): query i reads the h keys before it,
itself, and every earlier key j with (i - j) mod s = 0. Deterministic and spread evenly, it reaches every earlier
token within a few layers at SA's kernel cost (``attention.strided_local``; where the model has fewer layers than
that, (h, s) are the pair that reaches the most within them, ``spec.depth``), where the strided pattern alone
(``strided``) splits the row into s groups that never meet: SA against it asks whether a random spread routes better
than an even one that can reach as far."""
from __future__ import annotations

import torch

from .. import oracle
from ..registry import Variant
from ..strided_local import local_stride, local_strided_attention, strided_local_mask
from ._common import dense_with_lse


def mask(spec, n, perm=None, lengths=None):
    return strided_local_mask(spec.window, n, lengths, spec.depth)


def kernel_with_lse(call):
    if call.backend == "dense":
        return dense_with_lse(call, mask(call.spec, call.q.shape[2], None, call.lengths))
    return local_strided_attention(call.q, call.k, call.v, call.window, scale=call.scale, lengths=call.lengths,
                                   validate=False, depth=call.spec.depth)  # checked by the call


def keys_attended_row(spec, length, row=None):
    """Query i reads min(i, h) + 1 band keys and floor(i / s) strided ones (s > h: no key counted twice)."""
    h, s, _ = local_stride(length, spec.window, spec.depth)
    i = torch.arange(length)
    return int((torch.clamp(i, max=h) + 1 + i // s).sum())


def keys_computed_at(spec, n):
    h, s, _ = local_stride(n, spec.window, spec.depth)
    return min(n, h + 1 + -(-n // s))


VARIANT = STRIDED_LOCAL = Variant(
    name="strided_local", label="Strided+local", color="#6C3483", marker="d", paths=("strided_local",),
    kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.strided_local_mask(q.shape[2], spec.window, q.shape[0],
                                                                           lengths, q.device, spec.depth),
    keys_attended_row=keys_attended_row, keys_computed_at=keys_computed_at,
    windowed=True, min_window=3,
    fused_below=24.0,  # measured: docs/benchmarks/training.md
    revision=2,  # 2: (h, s) tuned for the model's depth where the fewest-layers pair needs more (issue 76)
    description="control: a local band and every s-th earlier key, reaching the whole row in a few layers at SA's "
                "kernel cost",
)
