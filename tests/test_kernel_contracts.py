"""Kernel contracts: a padded batch's ``perm`` must keep every row's padding out of its valid slots, and a
NaN or inf key or value reaches only the rows that see it (every variant and CPU backend, against the
float64 oracle), with the non-finite guard on (its debug mode). Small sizes: the whole file runs in seconds."""
import pytest
import torch

from sa_lightning.attention._finite import check_finite

from sa_lightning.attention import (AttentionSpec, get_variant, sa_swa_attention, sa_swa_union_attention,
                                    sample_permutation, sliding_window_attention, stochastic_attention)
from sa_lightning.attention import flex, oracle
from sa_lightning.attention.draws import layer_draws
from sa_lightning.attention.variants import SA

B, HQ, HKV, D, W = 2, 4, 2, 16, 16
BLOCK, TOP_K, SINK = 16, 3, 4
NAN, INF = float("nan"), float("inf")


@pytest.fixture(autouse=True)
def _guard_on():
    """The guard is opt-in (it reads a value back to the host per kernel call): these tests check its contract."""
    with check_finite():
        yield

#: (variant, backend, sink): every variant, every backend that runs on CPU, and the sinks
CASES = [("full", "auto", 0), ("swa", "banded", 0), ("swa", "dense", 0), ("swa", "flex", 0),
         ("sa", "banded", 0), ("sa", "dense", 0), ("sa", "flex", 0), ("sa_swa", "banded", 0),
         ("sa_swa", "dense", 0), ("sa_swa_union", "auto", 0), ("moba", "auto", 0),
         ("swa", "auto", SINK), ("sa", "auto", SINK), ("sa_swa_union", "auto", SINK),
         ("sa_bucket", "banded", 0), ("sa_bucket", "dense", 0), ("sa_bucket_swa_union", "auto", 0),
         ("sa_bucket", "auto", SINK)]


def _forward_cases():
    """(variant, backend, sink, n, padded, grad). A padded batch also holds a full row, so only the SA variants
    (whose kernels take another path with ``lengths``) run unpadded too; gradients where the forward differs
    (training kernels); n=24 (< 2w) where it has a path of its own (the union's and the sinks' dense lse)."""
    for name, backend, sink in CASES:
        pads = (False, True) if name in ("sa", "sa_swa", "sa_swa_union", "sa_bucket", "sa_bucket_swa_union") \
            else (True,)
        grads = (False,) if backend in ("flex", "dense") or name == "full" else (False, True)
        yield from ((name, backend, sink, 96, padded, grad) for padded in pads for grad in grads)
        if name == "sa_swa_union" or sink:
            yield from ((name, backend, sink, 24, True, grad) for grad in (False, True))


def _id(name, backend, sink, n=None, padded=None, grad=None):
    parts = [name, backend] + ([f"sink{sink}"] if sink else [])
    if n is not None:
        parts += [f"n{n}", "padded" if padded else "full_rows", "grad" if grad else "no_grad"]
    return "-".join(parts)


FORWARD = list(_forward_cases())
#: the cases whose backward is a kernel of its own
BACKWARD = [c for c in CASES if c[1] not in ("flex", "dense") and c[:2] != ("swa", "auto")]


def _qkv(n):
    g = torch.Generator().manual_seed(n)
    return tuple(torch.randn(B, h, n, D, generator=g) for h in (HQ, HKV, HKV))


def _lengths(n, padded):
    return torch.tensor([n, n * 5 // 8]) if padded else None


def _plant(q, k, v, lengths, *, queries=True):
    """Copies of q, k, v with non-finite entries at tokens that most rows cannot see (later tokens, other
    windows, unselected blocks), each inside a compute block whose other rows are checked; with
    ``lengths``, NaN and inf in every padding token as well. ``queries=False`` leaves q finite."""
    q, k, v = q.clone(), k.clone(), v.clone()
    n = q.shape[2]
    v[0, 0, n // 2 + 2] = NAN  # a whole value
    k[0, 1, n // 5, 0] = INF  # one channel of a key: a score of +inf or -inf, row by row
    v[1, 1, n // 3, 3] = INF  # one channel of a value
    if queries:
        q[1, 2, n // 2 - 7] = NAN  # a query: its own row only
    if lengths is not None:
        pad = int(lengths[1])
        if queries:
            q[1, :, pad:] = NAN
        k[1, :, pad:] = NAN
        v[1, :, pad:, ::2] = INF
    return q, k, v


def _masks(name, sink, q, k, perm, lengths, n):
    """The oracle's mask (B|1, 1|Hq, n, n) of each path of the variant, sinks as DESIGN.md defines them."""
    if name == "moba":
        return [oracle.moba_mask(q, k, BLOCK, TOP_K)]  # selected on the inputs as given (a NaN gate never selects)
    own = {"full": lambda: oracle.full_mask(n), "swa": lambda: oracle.swa_mask(n, W),
           "sa": lambda: oracle.sa_mask(perm, W, B, lengths),
           "sa_swa_union": lambda: oracle.sa_swa_union_mask(perm, W, B, lengths),
           "sa_bucket": lambda: oracle.sa_bucket_mask(perm, W, B, lengths),
           "sa_bucket_swa_union": lambda: oracle.sa_bucket_mask(perm, W, B, lengths) | oracle.swa_mask(n, W)}
    if name == "sa_swa":
        return [own["sa"](), own["swa"]()]
    mask = own[name]().view(-1, 1, n, n)
    i, j = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    return [mask | ((j < sink) & (j <= i)) if sink else mask]


def _sees(mask, q, k, v):
    """(B, Hq, n): the rows whose query is non-finite or that see a key or value that is."""
    n = q.shape[2]
    bad_kv = ~(torch.isfinite(k).all(-1) & torch.isfinite(v).all(-1))
    bad_kv = bad_kv.repeat_interleave(HQ // HKV, dim=1)  # query head h reads kv head h // G
    return (mask.expand(B, HQ, n, n) & bad_kv.unsqueeze(2)).any(-1) | ~torch.isfinite(q).all(-1)


def _valid(n, lengths):
    """(B, Hq, n): the rows the contract covers (outputs at padding tokens are meaningless)."""
    if lengths is None:
        return torch.ones(B, HQ, n, dtype=torch.bool)
    return (torch.arange(n).view(1, 1, n) < lengths.view(-1, 1, 1)).expand(B, HQ, n)


def _run(name, backend, sink, q, k, v, perm, lengths, grad):
    spec = AttentionSpec(name, window=W, block_size=BLOCK, top_k=TOP_K, backend=backend, sink=sink)
    ins = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    with torch.set_grad_enabled(grad):
        return get_variant(name)(*ins, spec, perm, lengths), ins


@pytest.fixture
def eager_flex(monkeypatch):
    """FlexAttention uncompiled (CPU forward), so no test waits for a compile."""
    monkeypatch.setattr(flex, "_compiled", lambda: flex._flex().flex_attention)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name,backend,sink,n,padded,grad", FORWARD, ids=[_id(*c) for c in FORWARD])
def test_non_finite_inputs_reach_only_the_rows_that_see_them(name, backend, sink, n, padded, grad, eager_flex):
    """Rows that cannot see a planted NaN or inf give exactly the oracle on clean inputs; rows that see it
    are non-finite or what the oracle gives on the planted inputs."""
    q, k, v = _qkv(n)
    lengths = _lengths(n, padded)
    perm = sample_permutation(n, batch=B, lengths=lengths, generator=torch.Generator().manual_seed(n + 1))
    qp, kp, vp = _plant(q, k, v, lengths)
    outs, _ = _run(name, backend, sink, qp, kp, vp, perm, lengths, grad)
    valid = _valid(n, lengths)
    for y, mask in zip(outs, _masks(name, sink, qp, kp, perm, lengths, n)):
        y = y.detach()
        clean = oracle.reference_attention(q, k, v, mask)
        raw = oracle.reference_attention(qp, kp, vp, mask)
        sees = _sees(mask, qp, kp, vp)
        blind, seen = valid & ~sees, valid & sees
        assert seen.any() and blind[0, 0, : n // 2 + 2].all()  # every row before the NaN value is blind
        if n == 96 and name != "full":  # and so are later rows outside its window or its selected blocks
            assert blind[0, 0, n // 2 + 3:].any()
        torch.testing.assert_close(y[blind], clean[blind], atol=1e-5, rtol=0)
        got, want = y[seen], raw[seen]
        assert bool((~torch.isfinite(got) | torch.isclose(got, want, atol=1e-5, rtol=0)).all()), \
            "a row that sees a non-finite token is finite but not what the oracle gives"
        assert bool((torch.isfinite(want) | ~torch.isfinite(got)).all()), "the oracle's non-finite entry is finite"


@pytest.mark.parametrize("name,backend,sink", BACKWARD, ids=[_id(*c) for c in BACKWARD])
def test_non_finite_keys_and_values_leave_the_gradients_of_blind_rows_exact(name, backend, sink):
    """Training through a batch with NaN or inf keys and values (padding included): the gradient of a loss
    on the rows that cannot see them is the oracle's on clean inputs, finite everywhere."""
    n = 96
    q, k, v = _qkv(n)
    lengths = _lengths(n, True)
    perm = sample_permutation(n, batch=B, lengths=lengths, generator=torch.Generator().manual_seed(n + 1))
    qp, kp, vp = _plant(q, k, v, lengths, queries=False)
    outs, ins = _run(name, backend, sink, qp, kp, vp, perm, lengths, grad=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    masks = _masks(name, sink, qp, kp, perm, lengths, n)
    refs = [oracle.reference_attention(*leaves, m) for m in masks]
    g = torch.Generator().manual_seed(3)
    blinds = [(_valid(n, lengths) & ~_sees(m, qp, kp, vp)).unsqueeze(-1) for m in masks]
    cots = [torch.randn(y.shape, generator=g) * blind for y, blind in zip(outs, blinds)]
    got = torch.autograd.grad(outs, ins, cots)
    want = torch.autograd.grad(refs, leaves, cots)
    for which, a, b in zip("qkv", got, want):
        assert bool(torch.isfinite(a).all()), f"d{which} is not finite"
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=lambda m: f"d{which}: {m}")


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_a_nan_value_reaches_exactly_its_window(grad):
    """SWA at w=8: a NaN value at token 20 reaches rows 20..27 only, not the earlier rows of its block."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, D, generator=g).requires_grad_(grad) for _ in range(3))
    v = v.detach().clone()
    v[0, :, 20] = NAN
    with torch.set_grad_enabled(grad):
        y = sliding_window_attention(q, k, v, 8, backend="banded")
    bad = (~torch.isfinite(y)).any(-1)
    assert bad[0, 0].nonzero().flatten().tolist() == list(range(20, 28))
    assert torch.equal(bad[0, 0], bad[0, 1])


# ---- lengths against perm -------------------------------------------------------------------------
ENTRY_POINTS = {
    "stochastic_attention": lambda q, k, v, p, lens: stochastic_attention(q, k, v, W, p, lengths=lens),
    "sa_swa_attention": lambda q, k, v, p, lens: sa_swa_attention(q, k, v, W, p, lengths=lens),
    "sa_swa_union_attention": lambda q, k, v, p, lens: sa_swa_union_attention(q, k, v, W, p, lengths=lens),
    "registry sa": lambda q, k, v, p, lens: get_variant("sa")(q, k, v, AttentionSpec("sa", window=W), p, lens),
    "registry sa with sinks": lambda q, k, v, p, lens: get_variant("sa")(
        q, k, v, AttentionSpec("sa", window=W, sink=SINK), p, lens),
    "registry sa_swa_union with sinks": lambda q, k, v, p, lens: get_variant("sa_swa_union")(
        q, k, v, AttentionSpec("sa_swa_union", window=W, sink=SINK), p, lens),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_perm_that_reads_padding_is_refused_in_one_sentence(entry):
    """One permutation of all 96 tokens with lengths [96, 48] would read 23 pad tokens in place of 23
    valid ones: refused, naming the row and the function that draws a padded perm."""
    q, k, v = _qkv(96)
    lengths = torch.tensor([96, 48])
    perm = sample_permutation(96, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError) as err:
        ENTRY_POINTS[entry](q, k, v, perm, lengths)
    message = str(err.value)
    assert "\n" not in message and message.endswith(".") and ". " not in message
    assert "row 1's padding token" in message and "lengths[1] = 48" in message
    assert "sample_permutation(96, lengths=lengths)" in message
    per_row = sample_permutation(96, batch=2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^row 1 of perm puts padding token \d+ in slot \d+, but with lengths\[1\]"):
        ENTRY_POINTS[entry](q, k, v, per_row, lengths)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_padded_perms_pass(entry):
    q, k, v = _qkv(96)
    lengths = torch.tensor([96, 48])
    drawn = sample_permutation(96, lengths=lengths, generator=torch.Generator().manual_seed(0))
    (by_row,) = layer_draws(SA, AttentionSpec(SA.name, window=16), 96, [0], seed=0, rows=[96, 48], mode="deterministic")
    shuffled_pad = drawn.clone()
    shuffled_pad[1, 48:] = shuffled_pad[1, 48:].flip(0)  # the padding's own order is free: it is never read
    for perm in (drawn, by_row, shuffled_pad):
        ENTRY_POINTS[entry](q, k, v, perm, lengths)
    ENTRY_POINTS[entry](q, k, v, torch.arange(96), lengths)  # a shared perm that keeps every row's padding
    ENTRY_POINTS[entry](q, k, v, sample_permutation(96), torch.tensor([96, 96]))


def test_a_drawn_perm_keeps_the_padding_in_place():
    """``perm=None`` with ``lengths`` draws one permutation per row that keeps its padding, as
    ``sample_permutation(n, lengths=...)`` does from the same generator."""
    q, k, v = _qkv(96)
    lengths = torch.tensor([96, 48])
    y = stochastic_attention(q, k, v, W, lengths=lengths, generator=torch.Generator().manual_seed(4))
    perm = sample_permutation(96, lengths=lengths, generator=torch.Generator().manual_seed(4))
    assert torch.equal(y, stochastic_attention(q, k, v, W, perm, lengths=lengths))


@pytest.mark.parametrize("variant", ["sa", "sa_swa"])
def test_a_padded_batch_through_the_model_never_reads_its_padding(variant):
    """``Transformer(idx, lengths=...)`` without ``perms`` draws per-row permutations that keep the padding in
    place: the valid positions' logits do not depend on what the padding holds."""
    from sa_lightning.models import ModelConfig, Transformer

    model = Transformer(ModelConfig(vocab_size=64, n_layer=2, n_head=2, d_model=32, max_seq_len=48,
                                    attention=AttentionSpec(variant, window=8))).double()
    idx = torch.randint(0, 64, (2, 48), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([48, 29])
    other = idx.clone()
    other[1, 29:] = (other[1, 29:] + 7) % 64
    with torch.no_grad():
        a, b = model(idx, perm_stream=3, lengths=lengths), model(other, perm_stream=3, lengths=lengths)
    torch.testing.assert_close(a[1, :29], b[1, :29], rtol=0, atol=0)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
