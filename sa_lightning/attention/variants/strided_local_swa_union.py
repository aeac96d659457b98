"""Training-free local-band strided+SWA: one softmax over SWA's window and the strided keys beyond it (the local band
lies inside the window), the twin of the gated ``strided_local_swa``."""
from __future__ import annotations

import torch

from .. import masks, oracle
from ..registry import Variant
from ..sinks import causal_keys
from ..strided_local import local_stride, local_strided_attention, strided_local_mask
from ._common import dense_with_lse


def mask(spec, n, perm=None, lengths=None):
    return masks.union(strided_local_mask(spec.window, n, lengths, spec.depth), masks.sliding_window(spec.window))


def kernel_with_lse(call):
    if call.backend == "dense":
        return dense_with_lse(call, mask(call.spec, call.q.shape[2], None, call.lengths))
    return local_strided_attention(call.q, call.k, call.v, call.window, scale=call.scale, lengths=call.lengths,
                                   validate=False, extra_band=call.window, depth=call.spec.depth)  # checked by the call


def keys_attended_row(spec, length, row=None):
    """SWA's window (which holds the local band), plus the strided keys at distance >= w."""
    h, s, _ = local_stride(length, spec.window, spec.depth)
    band = max(h + 1, spec.window)
    i = torch.arange(length)
    far = torch.clamp(i // s - (-(-band // s)) + 1, min=0)
    return causal_keys(length, band) + int(far.sum())


VARIANT = STRIDED_LOCAL_SWA_UNION = Variant(
    name="strided_local_swa_union", label="Strided+local+SWA", color="#4A235A", marker="8",
    paths=("strided_local_swa_union",), kernel_with_lse=kernel_with_lse, backends=("banded", "dense"),
    mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.strided_local_swa_union_mask(q.shape[2], spec.window,
                                                                                     q.shape[0], lengths, q.device,
                                                                                     spec.depth),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(n, spec.window + -(-n // local_stride(n, spec.window, spec.depth)[1])),
    windowed=True, min_window=3,
    revision=2,  # 2: (h, s) tuned for the model's depth (``strided_local``)
    description="control, training-free: the local-band strided pattern and SWA's window in one softmax",
)
