"""The variant registry is the one home of a variant: every registered variant is exact against the float64
oracle on every backend it claims, counts the keys its oracle mask holds, and carries every fact the rest of the
package asks for. A new variant is one file in ``attention/variants/`` plus one row of ``ROWS`` below; the last
test writes such a file and checks that the model, the patcher, the sweep plan, the benchmarks and the
reports take it with no other change."""
import importlib.util
import textwrap

import matplotlib.colors
import matplotlib.lines
import pytest
import torch

from sa_lightning.attention import VARIANTS, AttentionSpec, get_variant, oracle, variant_names
from sa_lightning.attention.draws import layer_draws
from sa_lightning.attention.sinks import keys_attended

#: one row per registered variant: the knobs its checks run with
ROWS = {
    "full": dict(window=16),
    "swa": dict(window=16),
    "sa": dict(window=16),
    "sa_fixed": dict(window=16),
    "sa_swa": dict(window=16),
    "moba": dict(window=16, block_size=16, top_k=3),
    "sa_swa_union": dict(window=16),
    "strided": dict(window=16),
    "strided_swa": dict(window=16),
    "strided_swa_union": dict(window=16),
    "strided_local": dict(window=16),
    "strided_local_swa": dict(window=16),
    "strided_local_swa_union": dict(window=16),
    "radix": dict(window=16),
    "random": dict(window=16),
    "random_swa": dict(window=16),
    "random_swa_union": dict(window=16),
    "sa_bucket": dict(window=16),
    "sa_bucket_swa_union": dict(window=16),
    "sa_bucket_swa": dict(window=16),
}
CPU_BACKENDS = ("banded", "dense", "flex")  # flex: its eager forward (FlexAttention has no CPU backward)
#: the variants whose pattern is tuned for the model's depth (``AttentionSpec.depth``), checked at depths where it
#: differs from the fewest-layers one (1: a band alone; 2: n = 96 and its padded row of 83 take other (h, s), bases)
TUNED = ("strided_local", "strided_local_swa", "strided_local_swa_union", "radix")
DEPTHS = (1, 2)


def test_every_registered_variant_has_a_row():
    assert set(ROWS) == set(VARIANTS)


def _cases():
    for name in ROWS:
        for backend in VARIANTS[name].backends:
            for n in (40, 96):  # under two windows (the dense paths of short rows) and over
                for depth in (None, *(DEPTHS if name in TUNED else ())):
                    yield name, backend, n, depth


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("name, backend, n, depth", list(_cases()))
def test_every_variant_matches_its_oracle_on_every_backend_it_claims(name, backend, n, depth, padded, monkeypatch):
    if backend == "flex":  # its eager forward on CPU (compiling costs seconds per shape there)
        from sa_lightning.attention import flex

        monkeypatch.setattr(flex, "_compiled", lambda: flex._flex().flex_attention)
    variant = get_variant(name)
    spec = AttentionSpec(name, backend=backend, depth=depth, **ROWS[name])
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, h, n, 8, generator=g) for h in (4, 2, 2))
    grad = backend != "flex"
    for t in (q, k, v):
        t.requires_grad_(grad)
    lengths = torch.tensor([n, n - 13]) if padded else None  # rows of their own length: valid tokens first
    # one draw per row (a padded batch keeps each row's padding in place)
    perm = variant.draw(spec, n, lengths if padded else torch.tensor([n, n]), g) if variant.draws else None
    outs = variant(q, k, v, spec, perm, lengths)
    masks = variant.oracle_masks(spec, q, k, perm, lengths)
    valid = torch.ones(2, 1, n, 1) if lengths is None else (torch.arange(n) < lengths.view(2, 1)).view(2, 1, n, 1)
    assert len(outs) == len(masks) == len(variant.paths)
    for out, mask in zip(outs, masks):
        ref = oracle.reference_attention(q.double(), k.double(), v.double(), mask)
        torch.testing.assert_close(out.double() * valid, ref * valid, atol=1e-5, rtol=0)
        if grad:
            w = torch.randn(out.shape, generator=g) * valid
            got = torch.autograd.grad((out * w).sum(), (q, k, v), retain_graph=True)
            want = torch.autograd.grad((ref * w.double()).sum(), (q, k, v))
            for a, b in zip(got, want):
                torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name, depth", [(name, None) for name in ROWS] + [(name, d) for name in TUNED
                                                                           for d in DEPTHS])
def test_every_variant_counts_the_keys_its_oracle_mask_holds(name, depth):
    variant = get_variant(name)
    spec = AttentionSpec(name, depth=depth, **ROWS[name])
    n, lengths = 96, torch.tensor([96, 61])
    (perm,) = layer_draws(variant, spec, n, [0], seed=1, lengths=lengths)
    q, k = torch.randn(2, 1, n, 8), torch.randn(2, 1, n, 8)
    keys, queries = keys_attended(variant, spec, n, perm=perm, lengths=lengths)
    valid = torch.arange(n).view(1, n) < lengths.view(2, 1)
    union = torch.stack([m.expand(2, 1, n, n) for m in variant.oracle_masks(spec, q, k, perm, lengths)]).any(0)
    assert queries == int(lengths.sum())
    assert keys == int((union[:, 0] & valid.view(2, n, 1) & valid.view(2, 1, n)).sum())
    assert 0 < variant.keys_computed(spec, n) <= 2 * n


@pytest.mark.parametrize("name", list(ROWS))
def test_every_variant_carries_what_the_package_asks_of_it(name):
    variant = get_variant(name)
    assert variant.label and variant.title and matplotlib.colors.is_color_like(variant.color)
    assert variant.marker in matplotlib.lines.Line2D.markers
    assert variant.kernel.__name__ != "<lambda>"  # a traceback names the kernel
    assert set(variant.backends) <= set(CPU_BACKENDS)
    assert set(variant.local_paths) <= set(variant.paths)
    if variant.gated:
        assert len(variant.paths) > 1 and get_variant(variant.training_free_twin).gated is False
        assert all(p in VARIANTS for p in variant.paths)  # each path is a variant: its oracle and mask
    if variant.takes_sink:
        assert variant.mask is not None and len(variant.paths) == 1
    if not variant.sparse:
        assert not (variant.windowed or variant.blocked)
    # the backends it does not claim are refused in one sentence
    for backend in set(CPU_BACKENDS) - set(variant.backends):
        with pytest.raises(ValueError, match=f"runs on the backends .* not '{backend}'"):
            AttentionSpec(name, backend=backend, **ROWS[name])


NEW_VARIANT = '''
"""A test variant: SWA at twice the window (what a control at equal compute looks like)."""
from sa_lightning.attention import masks
from sa_lightning.attention.functional import sliding_window_attention
from sa_lightning.attention.registry import Variant, register_variant
from sa_lightning.attention.sinks import causal_keys


def kernel(call):
    return (sliding_window_attention(call.q, call.k, call.v, 2 * call.window, scale=call.scale, backend=call.backend),)


WIDE = register_variant(Variant(
    name="swa_wide", label="SWA(2w)", color="#123456", marker="h", paths=("swa_wide",), kernel=kernel,
    mask=lambda spec, n, perm=None, lengths=None: masks.sliding_window(2 * spec.window),
    oracle_mask=lambda spec, q, k, perm, lengths: masks.dense(masks.sliding_window(2 * spec.window), q.shape[2]),
    keys_attended_row=lambda spec, length, row: causal_keys(length, 2 * spec.window),
    keys_computed_at=lambda spec, n: min(2 * spec.window, n), windowed=True, local_paths=("swa_wide",),
))
'''


def test_a_new_variant_is_one_file(tmp_path):
    """Registered from one file, a variant trains in the model, patches a Hugging Face model, enters the sweep
    plan, the training benchmark's default list and the reports, with no other change to the package."""
    path = tmp_path / "swa_wide.py"
    path.write_text(textwrap.dedent(NEW_VARIANT))
    spec_ = importlib.util.spec_from_file_location("swa_wide", path)
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    try:
        from sa_lightning.attention import trained_variant_names
        from sa_lightning.inference.plan import SweepConfig, cells
        from sa_lightning.models import ModelConfig, build_model
        from sa_lightning.models.patcher import PatchSpec

        assert "swa_wide" in variant_names(gated=False) and "swa_wide" in trained_variant_names()
        from sa_lightning.bench.train import build_parser

        assert "swa_wide" in build_parser().parse_args([]).variants  # bench train's default list
        cfg = ModelConfig(vocab_size=64, n_layer=2, n_head=2, d_model=32, max_seq_len=64,
                          attention=AttentionSpec("swa_wide", window=8))
        model = build_model(cfg)
        model(torch.randint(0, 64, (2, 64))).sum().backward()
        assert PatchSpec("swa_wide", 8).effective_window == 8
        sweep = SweepConfig(model="tiny", modes=["full", "swa_wide"], windows=[8, 16], tasks=["shakespeare_lastword"])
        assert {(c.mode, c.w_eff) for c in cells(sweep)} == {("full", None), ("swa_wide", 8), ("swa_wide", 16)}
        assert get_variant("swa_wide").label == "SWA(2w)"
        (y,) = get_variant("swa_wide")(*(torch.randn(1, 2, 40, 8) for _ in range(3)), AttentionSpec("swa_wide", window=4))
        assert y.shape == (1, 2, 40, 8)
    finally:
        VARIANTS.pop("swa_wide", None)


@pytest.mark.parametrize("n, shared", [(45, False), (45, True), (9, False), (37, True)])
def test_bucketed_sa_at_a_multiple_of_its_bucket_below_one_bucket_and_with_one_sigma_for_the_batch(n, shared):
    """b = 15 at w = 16: n = 45 is three whole buckets, n = 9 less than one; a shared (n,) σ serves the batch."""
    variant, spec = get_variant("sa_bucket"), AttentionSpec("sa_bucket", window=16)
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, h, n, 8, generator=g, requires_grad=True) for h in (4, 2, 2))
    perm = variant.draw(spec, n, None if shared else torch.tensor([n, n]), g)
    assert perm.dim() == (1 if shared else 2)
    for name in ("sa_bucket", "sa_bucket_swa_union"):
        (y,) = get_variant(name)(q, k, v, AttentionSpec(name, window=16), perm)
        (mask,) = get_variant(name).oracle_masks(AttentionSpec(name, window=16), q, k, perm)
        ref = oracle.reference_attention(q.double(), k.double(), v.double(), mask)
        torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=0)
        w = torch.randn(y.shape, generator=g)
        got, want = (torch.autograd.grad((out * w).sum(), (q, k, v)) for out in (y, ref))
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=0)


def test_bucketed_sa_reads_a_strided_kernel_output():
    """CUDA's flash kernel returns its output as a transposed view; the way back to token order takes it."""
    from sa_lightning.attention import bucketed

    n, b, heads = 30, 15, 4
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    order, _, inverse = bucketed._plan(perm, 2, b)
    y = torch.randn(2 * heads, b, n // b, 8).transpose(1, 2)  # (B * heads, nb, b, d), not contiguous
    back = bucketed._from_buckets(y, order, inverse, heads, n)
    flat = y.reshape(2, heads, n, 8)
    assert torch.equal(back, torch.take_along_dim(flat, inverse[:, None, :, None], dim=2))


@pytest.mark.parametrize("hkv", [1, 2])
def test_bucketed_sa_takes_grouped_query_heads_down_to_one_and_transposed_inputs(hkv):
    """A model's q, k, v are transposed views, and Qwen3-8B's shapes group many query heads on few kv heads (one
    kv head once made a stride-0 view that ``view`` refused)."""
    variant, spec = get_variant("sa_bucket"), AttentionSpec("sa_bucket", window=16)
    g = torch.Generator().manual_seed(hkv)
    q = torch.randn(2, 50, 4, 8, generator=g).transpose(1, 2)
    k, v = (torch.randn(2, 50, hkv, 8, generator=g).transpose(1, 2) for _ in range(2))
    perm = variant.draw(spec, 50, torch.tensor([50, 50]), g)
    (y,) = variant(q, k, v, spec, perm)
    (mask,) = variant.oracle_masks(spec, q, k, perm)
    torch.testing.assert_close(y.double(), oracle.reference_attention(q.double(), k.double(), v.double(), mask),
                               atol=1e-5, rtol=0)


def test_a_taken_name_is_refused_and_the_registry_keeps_its_variant():
    """``register_variant`` overwrote a name without a word (issue 63): a second "sa" would replace SA everywhere."""
    from dataclasses import replace

    from sa_lightning.attention.registry import register_variant

    sa = get_variant("sa")
    with pytest.raises(ValueError, match="variant name 'sa' is taken .* register yours under another name"):
        register_variant(replace(sa, label="not SA"))
    assert get_variant("sa") is sa and register_variant(sa) is sa  # the same object again is no change


def test_a_second_variant_under_a_registered_name_is_refused_not_swapped_in():
    """A caller's variant is never replaced without a word (issue 77's leftover): the same object again is fine."""
    from sa_lightning.attention import VARIANTS

    VARIANTS["my_twice"] = VARIANTS["full"]
    try:
        VARIANTS["my_twice"] = VARIANTS["full"]
        with pytest.raises(ValueError, match="'my_twice' is registered already"):
            VARIANTS["my_twice"] = VARIANTS["swa"]
    finally:
        del VARIANTS["my_twice"]
