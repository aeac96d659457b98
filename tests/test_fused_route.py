"""The CPU's fused route for short training rows (``Variant.fused_route``): each variant that takes it gives its own
kernel's output and gradients to rounding, and the route is taken only where it is meant to be (``auto`` on the
CPU, a training step, rows without padding, n under ``fused_below`` x the keys computed)."""
from __future__ import annotations

import pytest
import torch

from sa_lightning.attention import AttentionSpec, get_variant, variant_names
from sa_lightning.attention.draws import layer_draws
from sa_lightning.attention.registry import Call

FUSED = [name for name in variant_names() if get_variant(name).fused_below is not None
         and len(get_variant(name).paths) == 1 and get_variant(name).select is None]


def qkv(n: int, heads: int = 2, kv_heads: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, n, 8, generator=g, dtype=torch.float64, requires_grad=True)
            for h in (heads, kv_heads, kv_heads)]


def run(name: str, backend: str, n: int, heads: int = 2, kv_heads: int = 2, window: int = 8, per_row=False):
    variant = get_variant(name)
    spec = AttentionSpec(name, window, backend=backend)
    q, k, v = qkv(n, heads, kv_heads)
    if per_row:  # a draw per row, as evaluation and the ensembles make
        draws = [layer_draws(variant, spec, n, [0], seed=s)[0] for s in (1, 2)]
        perm = None if draws[0] is None else (torch.cat([d.reshape(1) for d in draws]) if variant.draw_ndim == 0
                                              else torch.stack(draws))
    else:
        (perm,) = layer_draws(variant, spec, n, [0], seed=1)
    (y,) = variant(q, k, v, spec, perm)
    grads = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum(), (q, k, v))
    return y, grads


def test_the_variants_that_take_it_are_the_studies_controls():
    assert {"sa", "sa_fixed", "swa", "random", "strided_local"} <= set(FUSED)
    assert "full" not in FUSED and "strided" not in FUSED and "sa_bucket" not in FUSED


@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("name", FUSED)
def test_the_fused_route_gives_the_variants_own_output_and_gradients(name, per_row):
    """``auto`` at n = 24, w = 8 (under every ``fused_below``) against the variant's own banded kernel, in float64:
    forward and all three gradients, grouped kv heads included."""
    variant, n = get_variant(name), 24
    assert n < variant.fused_below * variant.keys_computed(AttentionSpec(name, 8), n)
    fused, fused_grads = run(name, "auto", n, heads=4, kv_heads=2, per_row=per_row)
    own, own_grads = run(name, "banded", n, heads=4, kv_heads=2, per_row=per_row)
    torch.testing.assert_close(fused, own, rtol=1e-10, atol=1e-10)
    for a, b in zip(fused_grads, own_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def call_of(name: str, n: int, *, backend="auto", grad=True, lengths=None):
    spec = AttentionSpec(name, 8, backend=backend)
    q, k, v = (torch.randn(2, 2, n, 8, requires_grad=grad) for _ in range(3))
    variant = get_variant(name)
    return variant, Call(q, k, v, spec, variant.resolve_backend(backend, q), 8 ** -0.5, None, lengths, None, False)


def test_the_route_is_taken_only_where_it_is_meant_to_be():
    sa = get_variant("sa")
    variant, call = call_of("sa", 24)
    assert variant.fused_route(call)
    assert not sa.fused_route(call_of("sa", 24, grad=False)[1])  # evaluation keeps the variant's own kernel
    assert not sa.fused_route(call_of("sa", 24, backend="banded")[1])  # a backend asked for is honoured
    assert not sa.fused_route(call_of("sa", 24, lengths=torch.tensor([24, 20]))[1])  # padded rows
    assert not sa.fused_route(call_of("sa", 12 * 8)[1])  # long rows: the band is cheaper
    with torch.no_grad():
        assert not sa.fused_route(call)
    assert not get_variant("full").fused_route(call_of("full", 24)[1])
