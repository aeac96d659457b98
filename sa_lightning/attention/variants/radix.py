"""The radix control: query i reads itself and the earlier keys at the offsets a·p_k, the digits of a mixed-radix
number, with bases chosen for the row's n to reach every earlier token in the fewest layers SA's budget allows
(``attention.radix``; power-of-two offsets are its base-2 case; where the model has fewer layers than digits, the
bases that reach the most within them, ``spec.depth``). SA against it asks whether a random spread routes
better than a deterministic one that covers at least as fast: where this pattern reaches as far as SA at the depth a
model runs, what is left between them is the routing, not the reach."""
from __future__ import annotations

from .. import oracle
from ..radix import radix_attention, radix_mask, radix_offsets
from ..registry import Variant
from ._common import dense_output, dense_with_lse


def mask(spec, n, perm=None, lengths=None):
    return radix_mask(spec.window, n, lengths, spec.depth)


def kernel_with_lse(call):
    if call.backend == "dense":
        return dense_with_lse(call, mask(call.spec, call.q.shape[2], None, call.lengths))
    return radix_attention(call.q, call.k, call.v, call.window, scale=call.scale, lengths=call.lengths,
                           return_lse=True, depth=call.spec.depth)


def kernel(call):
    if call.backend == "dense":
        return (dense_output(call, mask(call.spec, call.q.shape[2], None, call.lengths)),)
    return (radix_attention(call.q, call.k, call.v, call.window, scale=call.scale, lengths=call.lengths,
                            depth=call.spec.depth),)


def keys_attended_row(spec, length, row=None):
    """Query i reads itself and each offset o <= i."""
    offsets = radix_offsets(max(length, 1), spec.window, spec.depth)
    return sum(1 + sum(1 for o in offsets if o <= i) for i in range(length))


VARIANT = RADIX = Variant(
    name="radix", label="Radix", color="#D35400", marker="P", paths=("radix",),
    kernel=kernel, kernel_with_lse=kernel_with_lse, backends=("banded", "dense"), mask=mask,
    oracle_mask=lambda spec, q, k, perm, lengths: oracle.radix_mask(q.shape[2], spec.window, q.shape[0], lengths,
                                                                    q.device, spec.depth),
    keys_attended_row=keys_attended_row,
    keys_computed_at=lambda spec, n: min(n, len(radix_offsets(max(n, 1), spec.window, spec.depth)) + 1),
    windowed=True, min_window=3,
    # its shifted-view kernel is slow in a training step (one layer, B = 32, two heads of 32, w = 16, one thread:
    # 74 ms at n = 128, 294 at 512, 725 at 1024, where the fused route took 6.5 and about 95, and 360 at 1024)
    fused_below=80.0,
    revision=2,  # 2: the bases tuned for the model's depth where the fewest digits are more (issue 76)
    description="control: the digits of a mixed-radix number as offsets, reaching the whole row in the fewest "
                "layers SA's budget allows",
)
