"""Gated SA+SWA (the paper's model): two paths, SA and SWA, on the same q, k, v, mixed by output gates that
the model learns. Training-free use needs the gates, so a Hugging Face model runs ``sa_swa_union`` instead."""
from __future__ import annotations

from ..functional import sa_swa_attention
from ..registry import Variant, register_variant
from ._common import check_permutation, draw_permutation, union_keys, union_mask


def kernel(call):
    return sa_swa_attention(call.q, call.k, call.v, call.window, call.perm, scale=call.scale, backend=call.backend,
                            lengths=call.lengths, inv=call.inv, validate=call.validate)


SA_SWA = register_variant(Variant(
    name="sa_swa", label="SA+SWA", color="#2ECC71", marker="D", paths=("sa", "swa"),
    kernel=kernel, backends=("banded", "flex", "dense"),
    mask=union_mask,  # the keys either path reads: the union
    keys_attended_row=union_keys,
    keys_computed_at=lambda spec, n: 2 * min(spec.window, n),  # two bands
    uses_permutation=True, draw=draw_permutation, check_draw=check_permutation,
    windowed=True, gated=True, training_free_twin="sa_swa_union", local_paths=("swa",),
    description="gated SA+SWA: an SA path and an SWA path mixed by learned output gates", title="SA + SWA",
))
