"""Every registry variant and CPU backend in float64, float32 and bfloat16 against the float64 oracle.

Inputs are drawn once in float64 and rounded to the dtype under test; the oracle then sees exactly the
rounded values (upcast), so any difference is the kernel's own arithmetic. Checked per path: the
output's dtype, the forward with gradients (the hand-written backward's path), the forward under
``no_grad`` (CPU's fused forward-only path), and dq, dk, dv against the oracle's float64 autograd.

Errors are measured relative to the reference's largest magnitude (outputs are averages of v, so
O(1); gradients sum over up to n queries, so their scale varies), with one bound per dtype:
- float64, 1e-10: unit roundoff is 1.1e-16 and a sum over ~100 keys costs a few hundred ulps; a
  single step through float32 anywhere (a cast, an lse kept in float32) costs ~1e-7 and fails.
- float32, 1e-5: unit roundoff 6e-8, same accumulation; the bound the exactness tests use.
- bfloat16, 3e-2: unit roundoff 3.9e-3. The kernels round the scaled q, the probabilities and the
  score gradients to bf16 before each matmul (the softmax itself is fp32), a few roundings stacked.
Measured worst cases over these cases (torch 2.13, CPU): float64 1e-15, float32 4e-7, bfloat16 6e-3
forward and 1.3e-2 for gradients.

The flex backend has no CPU backward and, compiled, costs seconds per shape on CPU and rejects float64
there; its kernels run eagerly here, forward only (``test_attention_flex`` covers the compiled path).
"""
import pytest
import torch

from sa_lightning.attention import AttentionSpec, band_inplace, flex, get_variant, oracle, sample_permutation
from sa_lightning.attention.permutation import gather_tokens, invert_permutation
from tests.test_attention_exact import _qkv

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 3e-2}
DTYPES = pytest.mark.parametrize("dtype", list(TOLERANCE), ids=lambda t: str(t).removeprefix("torch."))

W = 16
#: n < 2*W takes the short dense path even on the banded backend; 100 takes the band and pads its last block
LENGTHS = pytest.mark.parametrize("n", [24, 100], ids=["short", "banded"])
#: (variant, backend): the variants that take ``backend`` run on both CPU backends
KERNELS = [("full", "auto"), ("swa", "banded"), ("swa", "dense"), ("sa", "banded"), ("sa", "dense"),
           ("sa_swa", "banded"), ("sa_swa", "dense"), ("sa_swa_union", "auto"), ("moba", "auto")]


@pytest.fixture(autouse=True)
def _small_steps(monkeypatch):
    """SA+SWA's one-pass kernel goes a few windows per step here, as it does at real sizes."""
    monkeypatch.setattr(band_inplace, "_STEP_SCORES", 1 << 12)


def _mask(path, n, q, k, perm, batch, lengths):
    return {
        "full": lambda: oracle.full_mask(n),
        "swa": lambda: oracle.swa_mask(n, W),
        "sa": lambda: oracle.sa_mask(perm, W, batch, lengths),
        "sa_swa_union": lambda: oracle.sa_swa_union_mask(perm, W, batch, lengths),
        "moba": lambda: oracle.moba_mask(q, k, 8, 3),
    }[path]()


def _close(got, want, tol, what):
    """max |got - want| <= tol * max |want|, in float64."""
    err = (got.double() - want).abs().max().item()
    scale = max(want.abs().max().item(), 1e-30)
    assert err <= tol * scale, f"{what}: max error {err:.3g} exceeds {tol:g} x scale {scale:.3g}"


def _check(variant, backend, dtype, n, groups=2, hkv=2, lengths=None):
    B = 2 if lengths is None else len(lengths)
    tol = TOLERANCE[dtype]
    q64, k64, v64 = (t.detach().requires_grad_() for t in _qkv(n, groups, seed=n, batch=B, hkv=hkv, d=16,
                                                                   dtype=torch.float64))
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q64, k64, v64))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))  # exactly the rounded inputs
    lens = None if lengths is None else torch.tensor(lengths)
    perm = sample_permutation(n, batch=B, lengths=lens, generator=torch.Generator().manual_seed(n + 1))
    spec = AttentionSpec(variant, window=W, block_size=8, top_k=3, backend=backend)
    fn = get_variant(variant)
    valid = torch.ones(B, 1, n, 1, dtype=torch.bool)
    if lens is not None:  # outputs at padding tokens are meaningless
        valid = (torch.arange(n).view(1, n) < lens.view(-1, 1)).view(B, 1, n, 1)

    outs = fn(q, k, v, spec, perm, lens)
    with torch.no_grad():
        fast = fn(q, k, v, spec, perm, lens)
    refs = [oracle.reference_attention(q64, k64, v64, _mask(p, n, q64, k64, perm, B, lens)) for p in fn.paths]
    g = torch.Generator().manual_seed(7)
    cotangents = [torch.randn(r.shape, generator=g, dtype=torch.float64) * valid for r in refs]
    for path, out, no_grad_out, ref in zip(fn.paths, outs, fast, refs):
        assert out.dtype == dtype and no_grad_out.dtype == dtype and out.shape == q.shape, path
        _close(out * valid, ref.detach() * valid, tol, f"{path} forward")
        _close(no_grad_out * valid, ref.detach() * valid, tol, f"{path} no_grad forward")
    got = torch.autograd.grad(outs, (q, k, v), [c.to(dtype) for c in cotangents])
    want = torch.autograd.grad(refs, (q64, k64, v64), cotangents)
    for name, a, b in zip("qkv", got, want):
        assert a.dtype == dtype, f"d{name} dtype"
        _close(a, b, tol, f"d{name}")


@DTYPES
@LENGTHS
@pytest.mark.parametrize("variant,backend", KERNELS, ids=[f"{v}-{b}" for v, b in KERNELS])
def test_variant_matches_oracle(variant, backend, n, dtype):
    """GQA (4 query heads on 2 kv heads), a per-row permutation for the SA variants."""
    _check(variant, backend, dtype, n)


PADDED = [("sa", "banded"), ("sa", "dense"), ("sa_swa", "banded"), ("sa_swa_union", "auto")]


@DTYPES
@pytest.mark.parametrize("n,lengths", [(24, (24, 9, 1)), (100, (100, 37, 5))], ids=["short", "banded"])
@pytest.mark.parametrize("variant,backend", PADDED, ids=[f"{v}-{b}" for v, b in PADDED])
def test_padded_rows_match_oracle(variant, backend, n, lengths, dtype):
    """Right-padded rows with ``lengths`` (one head per kv head): valid tokens match the oracle."""
    _check(variant, backend, dtype, n, groups=1, hkv=2, lengths=lengths)


@DTYPES
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_eager_flex_forward_matches_oracle(dtype):
    n = 100
    q, k, v = (t.detach().to(dtype) for t in _qkv(n, 2, seed=n, hkv=2, d=16, dtype=torch.float64))
    q64, k64, v64 = (t.double() for t in (q, k, v))
    perm = sample_permutation(n, batch=2, generator=torch.Generator().manual_seed(n + 1))
    scale = 0.25
    y = flex.swa_flex(q, k, v, W, scale=scale, compiled=False)
    assert y.dtype == dtype
    _close(y, oracle.reference_attention(q64, k64, v64, oracle.swa_mask(n, W), scale), TOLERANCE[dtype], "swa flex")
    qs, ks, vs = (gather_tokens(t, perm) for t in (q, k, v))
    y = gather_tokens(flex.sa_flex_slots(qs, ks, vs, perm, W, scale=scale, compiled=False), invert_permutation(perm))
    assert y.dtype == dtype
    _close(y, oracle.reference_attention(q64, k64, v64, oracle.sa_mask(perm, W, 2), scale), TOLERANCE[dtype], "sa flex")
