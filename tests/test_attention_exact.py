"""Every fast path against the dense float64 oracle: forward and q/k/v gradients, fp32, <= 1e-5.

Each forward is checked twice: with gradients (the hand-written backward's path) and under
``torch.no_grad`` (the fused forward-only path that inference takes on CPU)."""
import pytest
import torch

from sa_lightning.attention import (
    AttentionSpec,
    full_attention,
    get_variant,
    moba_attention,
    sample_permutation,
    sliding_window_attention,
    stochastic_attention,
)
from sa_lightning.attention import oracle

TOL = 1e-5
WINDOWS = (2, 3, 4, 16, 256)


def _lengths(w):
    return sorted({n for n in (1, 2, 7, w - 1, w, w + 1, 2 * w + 3, 1000, 1024) if n >= 1})


CASES = [(n, w) for w in WINDOWS for n in _lengths(w)]


def _qkv(n, groups, seed, batch=2, hkv=1, d=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(batch, h, n, d, generator=g, dtype=dtype).requires_grad_()  # noqa: E731
    return make(hkv * groups), make(hkv), make(hkv)


def _assert_matches(fn, q, k, v, mask, rtol=0.0):
    out = fn()
    ref = oracle.reference_attention(q, k, v, mask)
    with torch.no_grad():
        torch.testing.assert_close(fn(), ref.detach(), atol=TOL, rtol=rtol, msg=lambda m: f"no_grad forward: {m}")
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, ref, atol=TOL, rtol=rtol)
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, atol=TOL, rtol=rtol, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("n,w", CASES)
def test_swa_matches_oracle(n, w, groups):
    q, k, v = _qkv(n, groups, seed=n * 31 + w)
    _assert_matches(lambda: sliding_window_attention(q, k, v, w), q, k, v, oracle.swa_mask(n, w), rtol=TOL)


@pytest.mark.parametrize("per_row", [False, True], ids=["shared_perm", "per_row_perm"])
@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("n,w", CASES)
def test_sa_matches_oracle(n, w, groups, per_row):
    q, k, v = _qkv(n, groups, seed=n * 17 + w)
    perm = sample_permutation(n, batch=2 if per_row else None, generator=torch.Generator().manual_seed(n + w))
    # with w >= n, dv of early tokens sums over up to 4*n queries: fp32 needs the relative term too
    _assert_matches(lambda: stochastic_attention(q, k, v, w, perm), q, k, v, oracle.sa_mask(perm, w, 2), rtol=TOL)


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("n", [1, 2, 7, 300, 1024])
def test_full_matches_oracle(n, groups):
    q, k, v = _qkv(n, groups, seed=n)
    # dv of early tokens sums over up to 4*1024 queries, so fp32 SDPA also gets a relative 1e-5.
    _assert_matches(lambda: full_attention(q, k, v), q, k, v, oracle.full_mask(n), rtol=TOL)


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("n,block,top_k", [
    (1, 4, 2), (7, 2, 3), (7, 3, 1), (64, 16, 2), (100, 16, 3), (257, 16, 4), (1000, 64, 2), (1024, 64, 3), (300, 7, 50),
])
def test_moba_matches_oracle(n, block, top_k, groups):
    q, k, v = _qkv(n, groups, seed=n + block + top_k)
    mask = oracle.moba_mask(q, k, block, top_k)
    _assert_matches(lambda: moba_attention(q, k, v, block, top_k), q, k, v, mask)


@pytest.mark.parametrize("n,block,top_k,groups", [(1, 4, 2, 1), (100, 16, 3, 4), (300, 7, 50, 1), (257, 128, 4, 2)])
def test_moba_dense_backend_matches_oracle(n, block, top_k, groups):
    q, k, v = _qkv(n, groups, seed=n + block)
    mask = oracle.moba_mask(q, k, block, top_k)
    _assert_matches(lambda: moba_attention(q, k, v, block, top_k, backend="dense"), q, k, v, mask)


def test_moba_selects_real_past_blocks():
    """The oracle's selection is not trivial: queries read more than their own block."""
    q, k, _ = _qkv(256, 1, seed=3)
    sel = oracle.reference_moba_selection(q, k, 16, 3)
    assert sel.sum(-1).max() == 2 and sel[:, :, :16].sum() == 0


@pytest.mark.parametrize("n,w", [(7, 3), (300, 16), (1024, 256)])
def test_sa_swa_paths_match_oracle(n, w):
    q, k, v = _qkv(n, 2, seed=5)
    perm = sample_permutation(n, generator=torch.Generator().manual_seed(1))
    y_sa, y_swa = get_variant("sa_swa")(q, k, v, AttentionSpec("sa_swa", window=w), perm)
    torch.testing.assert_close(y_sa, oracle.reference_attention(q, k, v, oracle.sa_mask(perm, w, 2)), atol=TOL, rtol=0)
    torch.testing.assert_close(y_swa, oracle.reference_attention(q, k, v, oracle.swa_mask(n, w)), atol=TOL, rtol=0)


@pytest.mark.parametrize("steps", ["cpu", "one"])
@pytest.mark.parametrize("groups,hkv", [(1, 1), (2, 2)])
@pytest.mark.parametrize("n,w,lens", [(1024, 256, None), (700, 64, None), (300, 16, (300, 120)), (64, 16, (64, 14)),
                                      (40, 8, (40, 3)), (16, 8, None)])
def test_sa_swa_one_pass_matches_oracle(n, w, lens, groups, hkv, steps, monkeypatch):
    """Gated SA+SWA on the banded backend runs both bands in one pass: both paths' outputs and q/k/v
    gradients match the oracle, with shared and per-row permutations, GQA and padded rows, whether the
    windows go a few per step (CPU; steps end inside a band's windows) or all in one step with the spare
    windows between bands (other devices). Rows shorter than two windows use the dense path."""
    from sa_lightning.attention import band_inplace
    from sa_lightning.attention.functional import sa_swa_attention
    from sa_lightning.attention.variants import sa_swa as sa_swa_file

    if steps == "cpu":
        monkeypatch.setattr(band_inplace, "_STEP_SCORES", 1 << 16)  # a few windows per step at w=256
    else:
        monkeypatch.setattr(band_inplace, "_steps", lambda segments, real, stride, *_: [(0, segments * stride)])
    calls = []
    real = sa_swa_file.multi_band_attention
    monkeypatch.setattr(sa_swa_file, "multi_band_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    B = 2
    lengths = None if lens is None else torch.tensor(lens)
    q, k, v = _qkv(n, groups, seed=n + w, batch=B, hkv=hkv)
    # one permutation shared by the batch, or one per row with the padded rows
    perm = sample_permutation(n, batch=None if lens is None else B, lengths=lengths,
                              generator=torch.Generator().manual_seed(n))
    y_sa, y_swa = sa_swa_attention(q, k, v, w, perm, lengths=lengths)
    assert len(calls) == (n >= 2 * w)
    ref_sa = oracle.reference_attention(q, k, v, oracle.sa_mask(perm, w, B, lengths))
    ref_swa = oracle.reference_attention(q, k, v, oracle.swa_mask(n, w))
    valid = torch.ones(B, 1, n, 1)
    if lengths is not None:
        valid = (torch.arange(n).view(1, n) < lengths.view(-1, 1)).view(B, 1, n, 1).float()
    torch.testing.assert_close(y_sa * valid, ref_sa * valid, atol=TOL, rtol=TOL)
    torch.testing.assert_close(y_swa, ref_swa, atol=TOL, rtol=TOL)
    g_sa, g_swa = torch.randn_like(y_sa) * valid, torch.randn_like(y_swa)
    got = torch.autograd.grad((y_sa, y_swa), (q, k, v), (g_sa, g_swa))
    want = torch.autograd.grad((ref_sa, ref_swa), (q, k, v), (g_sa, g_swa))
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL, msg=lambda m: f"d{name}: {m}")
    with torch.no_grad():  # forward-only inference keeps each path's fused SDPA kernel
        fast_sa, fast_swa = sa_swa_attention(q, k, v, w, perm, lengths=lengths)
    assert len(calls) == (n >= 2 * w)
    torch.testing.assert_close(fast_sa * valid, y_sa.detach() * valid, atol=TOL, rtol=0)
    torch.testing.assert_close(fast_swa, y_swa.detach(), atol=TOL, rtol=0)


@pytest.mark.parametrize("n,w", [(5, 6), (5, 1000), (300, 301), (64, 130)])
def test_sa_wider_than_sequence_is_full(n, w):
    q, k, v = _qkv(n, 1, seed=9)
    perm = sample_permutation(n, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(stochastic_attention(q, k, v, w, perm), full_attention(q, k, v), atol=TOL, rtol=0)
    torch.testing.assert_close(sliding_window_attention(q, k, v, w), full_attention(q, k, v), atol=TOL, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["swa", "sa", "moba"])
def test_half_precision_inputs(dtype, variant):
    n, w = 700, 64
    q, k, v = _qkv(n, 2, seed=11, dtype=dtype)
    perm = sample_permutation(n, generator=torch.Generator().manual_seed(4))
    spec = AttentionSpec(variant, window=w, block_size=32, top_k=3)
    (out,) = get_variant(variant)(q, k, v, spec, perm)
    assert out.dtype == dtype
    mask = {
        "swa": lambda: oracle.swa_mask(n, w),
        "sa": lambda: oracle.sa_mask(perm, w, 2),
        "moba": lambda: oracle.moba_mask(q, k, 32, 3),
    }[variant]()
    ref = oracle.reference_attention(q, k, v, mask)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=0)
    with torch.no_grad():
        (fast,) = get_variant(variant)(q, k, v, spec, perm)
    assert fast.dtype == dtype
    torch.testing.assert_close(fast.float(), ref.float(), atol=2e-2, rtol=0)
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_generator_reproduces_sa():
    q, k, v = _qkv(500, 1, seed=1)
    a = stochastic_attention(q, k, v, 16, generator=torch.Generator().manual_seed(7))
    b = stochastic_attention(q, k, v, 16, generator=torch.Generator().manual_seed(7))
    c = stochastic_attention(q, k, v, 16, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_sa_output_is_causal():
    """Changing a future token never changes an earlier output."""
    q, k, v = _qkv(600, 1, seed=2)
    perm = sample_permutation(600, generator=torch.Generator().manual_seed(3))
    base = stochastic_attention(q, k, v, 32, perm)
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, :, 400:] += 5
    v2[:, :, 400:] -= 5
    moved = stochastic_attention(q, k2, v2, 32, perm)
    torch.testing.assert_close(moved[:, :, :400], base[:, :, :400], atol=1e-6, rtol=0)


PADDED = [(40, 8, (40, 17, 3, 1)), (300, 16, (300, 120, 5, 299)), (12, 16, (12, 5, 1, 9)), (64, 16, (64, 14, 15, 16)),
          (1024, 256, (1024, 511, 600, 2))]


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("n,w,lens", PADDED)
def test_padded_sa_matches_oracle_and_solo_rows(n, w, lens, groups):
    """Right-padded batch with per-row lengths: valid rows match the oracle (forward and grads), pad
    keys get no gradient (never read), and every row equals the same sequence run alone."""
    lengths = torch.tensor(lens)
    B = len(lens)
    q, k, v = _qkv(n, groups, seed=n + w, batch=B)
    perm = sample_permutation(n, lengths=lengths, generator=torch.Generator().manual_seed(w))
    for b, length in enumerate(lens):  # valid tokens fill the first slots, padding keeps its place
        assert sorted(perm[b, :length].tolist()) == list(range(length))
        assert perm[b, length:].tolist() == list(range(length, n))
    valid = (torch.arange(n).view(1, n) < lengths.view(-1, 1)).view(B, 1, n, 1).float()
    out = stochastic_attention(q, k, v, w, perm, lengths=lengths)
    ref = oracle.reference_attention(q, k, v, oracle.sa_mask(perm, w, B, lengths))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out * valid, ref * valid, atol=TOL, rtol=TOL)
    with torch.no_grad():
        fast = stochastic_attention(q, k, v, w, perm, lengths=lengths)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast * valid, ref.detach() * valid, atol=TOL, rtol=TOL)
    grad = torch.randn_like(out) * valid
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b_ in zip(got, want):
        torch.testing.assert_close(a, b_, atol=TOL, rtol=TOL)
    for b, length in enumerate(lens):
        assert got[1][b, :, length:].abs().max() == 0 if length < n else True
        solo = stochastic_attention(q[b:b + 1, :, :length], k[b:b + 1, :, :length], v[b:b + 1, :, :length], w,
                                    perm[b, :length])
        torch.testing.assert_close(out[b:b + 1, :, :length], solo, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize("n,w,lens", [(300, 16, None), (7, 4, None), (1024, 256, None), (1000, 32, (1000, 400)),
                                      (64, 16, (64, 30)), (257, 64, (257, 3))])
def test_sa_swa_union_matches_oracle(n, w, lens, groups):
    """Training-free SA+SWA: one softmax over the union of both masks, merged from two bands by log-sum-exp."""
    from sa_lightning.attention import masks, sa_swa_union_attention

    B = 2
    q, k, v = _qkv(n, groups, seed=n + 3 * w, batch=B)
    lengths = None if lens is None else torch.tensor(lens)
    perm = sample_permutation(n, batch=B, lengths=lengths, generator=torch.Generator().manual_seed(n))
    mask = masks.dense(masks.union(masks.stochastic(oracle.slots_of(perm, B), w, lengths), masks.sliding_window(w)),
                       n, batch=B)
    valid = torch.ones(B, 1, n, 1)
    if lengths is not None:
        mask = mask & (torch.arange(n).view(1, 1, 1, n) < lengths.view(-1, 1, 1, 1))
        valid = (torch.arange(n).view(1, n) < lengths.view(-1, 1)).view(B, 1, n, 1).float()
    out = sa_swa_union_attention(q, k, v, w, perm, lengths=lengths)
    ref = oracle.reference_attention(q, k, v, mask)
    torch.testing.assert_close(out * valid, ref * valid, atol=TOL, rtol=TOL)
    with torch.no_grad():
        fast = sa_swa_union_attention(q, k, v, w, perm, lengths=lengths)
    torch.testing.assert_close(fast * valid, ref.detach() * valid, atol=TOL, rtol=TOL)
    grad = torch.randn_like(out) * valid
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, b, atol=TOL, rtol=TOL)


def test_forward_only_takes_the_fused_path(monkeypatch):
    """Under no_grad the banded kernel reads its windows in place through SDPA; with gradients it keeps
    the hand-written backward. Both give the same output."""
    from sa_lightning.attention import banded

    calls = []
    real = banded.fused_window_forward
    monkeypatch.setattr(banded, "fused_window_forward", lambda *a: calls.append(1) or real(*a))
    q, k, v = _qkv(300, 2, seed=6)
    perm = sample_permutation(300, generator=torch.Generator().manual_seed(6))
    with_grad = stochastic_attention(q, k, v, 16, perm)
    assert calls == []
    with torch.no_grad():
        without = stochastic_attention(q, k, v, 16, perm)
        sliding_window_attention(q, k, v, 16)
    assert len(calls) == 2
    torch.testing.assert_close(without, with_grad.detach(), atol=TOL, rtol=0)
    with torch.inference_mode():
        stochastic_attention(q.detach(), k.detach(), v.detach(), 16, perm)
    assert len(calls) == 3


def test_moba_forward_only_takes_the_fused_path(monkeypatch):
    """MoBA's no_grad forward groups (query, block) pairs into tiles for SDPA; it equals the autograd path."""
    from sa_lightning.attention import moba

    calls = []
    real = moba._selected_fused
    monkeypatch.setattr(moba, "_selected_fused", lambda *a: calls.append(1) or real(*a))
    q, k, v = _qkv(1000, 4, seed=8, hkv=2)
    with_grad = moba_attention(q, k, v, 16, 4)
    assert calls == []
    with torch.no_grad():
        without = moba_attention(q, k, v, 16, 4)
    assert calls == [1]
    torch.testing.assert_close(without, with_grad.detach(), atol=TOL, rtol=0)


@pytest.mark.parametrize("variant", ["swa", "sa", "sa_swa_union", "moba"])
def test_forward_only_accepts_the_models_transposed_heads(variant):
    """The model hands over q, k, v as (B, n, H, d) memory viewed as (B, H, n, d); the fused paths,
    which read windows as strided views, give what contiguous inputs give."""
    g = torch.Generator().manual_seed(12)
    x, y, z = (torch.randn(2, 700, h, 16, generator=g) for h in (4, 2, 2))
    q, k, v = (t.transpose(1, 2) for t in (x, y, z))
    perm = sample_permutation(700, batch=2, generator=g)
    spec = AttentionSpec(variant, window=64, block_size=32, top_k=3)
    with torch.no_grad():
        (a,) = get_variant(variant)(q, k, v, spec, perm)
        (b,) = get_variant(variant)(q.contiguous(), k.contiguous(), v.contiguous(), spec, perm)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
