"""Attention sinks and the keys-per-query budget, against the float64 oracle's dense masks."""
import pytest
import torch

from sa_lightning.attention import AttentionSpec, get_variant, sample_permutation
from sa_lightning.attention.oracle import (full_mask, moba_mask, reference_attention, sa_mask, sa_swa_union_mask,
                                           swa_mask)
from sa_lightning.attention.sinks import keys_attended

# (n, w, sink): the banded kernel, the dense path (n < 2w), an odd window, sink 1, a sink longer than the rows
CASES = [(48, 8, 4), (48, 32, 4), (130, 16, 3), (37, 5, 1), (64, 8, 80)]


def _qkv(B, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 4, n, 8, dtype=torch.float64, generator=g)
    k = torch.randn(B, 2, n, 8, dtype=torch.float64, generator=g)
    return q, k, torch.randn(B, 2, n, 8, dtype=torch.float64, generator=g)


def _oracle_mask(variant, w, sink, perm, lengths, B, n):
    """The oracle's own mask of the variant, plus the sinks as DESIGN.md defines them (j < sink and j <= i),
    minus padded keys: (B, 1, n, n)."""
    own = {"full": lambda: full_mask(n), "swa": lambda: swa_mask(n, w),
           "sa": lambda: sa_mask(perm, w, B, lengths), "sa_swa_union": lambda: sa_swa_union_mask(perm, w, B, lengths)}
    mask = own[variant]().view(-1, 1, n, n).expand(B, 1, n, n)
    i, j = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    mask = mask | ((j < sink) & (j <= i)).view(1, 1, n, n)
    valid = torch.arange(n).view(1, -1) < lengths.view(-1, 1)
    return mask & valid.view(B, 1, 1, n), valid


@pytest.mark.parametrize("n, w, sink", CASES)
@pytest.mark.parametrize("variant", ["swa", "sa", "sa_swa_union"])
def test_sinks_are_exact_against_the_dense_oracle_with_padding(variant, n, w, sink):
    B = 3
    q, k, v = _qkv(B, n)
    lengths = torch.tensor([n, n - 7, 5])
    perm = sample_permutation(n, lengths=lengths, generator=torch.Generator().manual_seed(1))
    (y,) = get_variant(variant)(q, k, v, AttentionSpec(variant, window=w, sink=sink), perm, lengths)
    mask, valid = _oracle_mask(variant, w, sink, perm, lengths, B, n)
    ref = reference_attention(q, k, v, mask)
    rows = valid.view(B, 1, n, 1).expand_as(y)
    torch.testing.assert_close(y[rows], ref[rows], atol=1e-12, rtol=0)


def test_sinks_are_read_and_a_sink_of_zero_changes_nothing():
    q, k, v = _qkv(1, 96, seed=3)
    spec = AttentionSpec("sa", window=8)
    perm = sample_permutation(96, generator=torch.Generator().manual_seed(0))
    (plain,) = get_variant("sa")(q, k, v, spec, perm)
    (zero,) = get_variant("sa")(q, k, v, AttentionSpec("sa", window=8, sink=0), perm)
    (sunk,) = get_variant("sa")(q, k, v, AttentionSpec("sa", window=8, sink=4), perm)
    torch.testing.assert_close(zero, plain, atol=0, rtol=0)
    assert (sunk - plain).abs().amax() > 1e-3  # the sink keys do change the output


def test_sink_gradients_flow_on_cpu():
    q, k, v = (t.float().requires_grad_() for t in _qkv(1, 64))
    perm = sample_permutation(64, generator=torch.Generator().manual_seed(0))
    (y,) = get_variant("sa")(q, k, v, AttentionSpec("sa", window=8, sink=4), perm)
    y.square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("spec, message", [
    (dict(variant="sa", sink=-1), "sink must be an integer >= 0"),
    (dict(variant="moba", sink=4), "sink applies to the variants swa, sa, sa_fixed, sa_swa_union"),
    (dict(variant="sa_swa", sink=2), "not 'sa_swa'"),
])
def test_bad_sinks_are_refused_in_one_sentence(spec, message):
    with pytest.raises(ValueError, match=message):
        AttentionSpec(**spec)


def keys_per_query(variant, n, *, window=1, block_size=64, top_k=2, sink=0, **kwargs):
    """The registry's count for a variant name and its knobs."""
    spec = AttentionSpec(variant, window=window, block_size=block_size, top_k=top_k, sink=sink)
    return keys_attended(get_variant(variant), spec, n, **kwargs)


@pytest.mark.parametrize("n, w, sink", CASES)
@pytest.mark.parametrize("variant", ["full", "swa", "sa", "sa_swa_union"])
def test_keys_per_query_counts_the_oracle_mask(variant, n, w, sink):
    B = 3
    lengths = torch.tensor([n, n - 7, 5])
    perm = sample_permutation(n, lengths=lengths, generator=torch.Generator().manual_seed(2))
    sink = 0 if variant == "full" else sink
    mask, valid = _oracle_mask(variant, w, sink, perm, lengths, B, n)
    keys, queries = keys_per_query(variant, n, window=w, perm=perm, lengths=lengths, sink=sink)
    assert queries == int(lengths.sum())
    assert keys == int((mask[:, 0] & valid.view(B, n, 1)).sum())


@pytest.mark.parametrize("n, c, top_k", [(64, 8, 2), (100, 16, 3), (20, 32, 2)])
def test_keys_per_query_counts_moba_as_the_oracle_selects(n, c, top_k):
    q, k, _ = _qkv(2, n)
    mask = moba_mask(q, k, c, top_k)  # (B, Hq, n, n): the gate picks per head, the count is the same
    keys, queries = keys_per_query("moba", n, block_size=c, top_k=top_k, batch=2)
    assert queries == 2 * n
    assert keys * q.shape[1] == int(mask.sum())


def test_sa_swa_union_reads_more_keys_than_swa_at_the_same_window():
    n, w = 1024, 32
    perm = sample_permutation(n, generator=torch.Generator().manual_seed(0))
    swa = keys_per_query("swa", n, window=w)[0] / n
    sa = keys_per_query("sa", n, window=w, perm=perm)[0] / n
    union = keys_per_query("sa_swa_union", n, window=w, perm=perm)[0] / n
    assert swa < union < swa + sa  # SA's causal half-band adds about (w - 1) / 2 keys, minus the overlap
    assert abs(sa - (w - 1) / 2) < 2
