"""The random-keys control (issue 35): its draw has SA's connection probability with independent edges, is made
as σ is (per layer and step in training, per row's own tokens in evaluation), and trains through the shipped
config swap. Exactness against the oracle, key counts and the registry facts are checked for every variant in
``test_variant_registry.py``."""
import math

import pytest
import torch

from sa_lightning.attention import AttentionSpec, get_variant, sample_permutation
from sa_lightning.attention.draws import layer_draws
from sa_lightning.attention.oracle import random_mask, sa_mask
from sa_lightning.attention.random_keys import check_keys, key_table, probability
from sa_lightning.attention.variants import RANDOM, SA

N, W = 48, 12


def _dense(seeds) -> torch.Tensor:
    return random_mask(seeds, W, 1, N)[0, 0]


def _degrees(masks: torch.Tensor) -> torch.Tensor:
    """(draws, n) keys each query reads."""
    return masks.sum(-1).double()


def test_each_earlier_key_is_read_with_sas_probability_and_independently():
    """Over 600 draws: every query's mean degree is SA's expected degree 1 + p * i (p = (2*ceil(w/2) - 2)/(n - 1),
    SA's exact connection probability), and the last query's degree has the binomial variance p(1-p)(n-1) of
    independent edges, which SA's permutation (a degree fixed by its band) does not have."""
    spec = AttentionSpec(RANDOM.name, window=W)
    draws = torch.stack([_dense(RANDOM.draw(spec, N, None, torch.Generator().manual_seed(s))) for s in range(600)])
    p = probability(N, W)
    assert p == pytest.approx((2 * math.ceil(W / 2) - 2) / (N - 1))
    i = torch.arange(N, dtype=torch.float64)
    mean = _degrees(draws).mean(0)
    se = torch.sqrt(p * (1 - p) * i.clamp(min=1) / 600)
    assert ((mean - (1 + p * i)).abs() <= 5 * se + 1e-9).all()
    var = _degrees(draws)[:, -1].var()
    assert var == pytest.approx(p * (1 - p) * (N - 1), rel=0.2)
    # SA at the same window: the same mean degree, but the last query's degree hardly varies
    sa = torch.stack([sa_mask(sample_permutation(N, generator=torch.Generator().manual_seed(s)), W, 1)[0, 0]
                      for s in range(600)])
    torch.testing.assert_close(_degrees(sa).mean(0)[1:], (1 + p * i)[1:], atol=0.35, rtol=0)
    assert _degrees(sa)[:, -1].var() < 0.5 * var
    # two keys of one query are independent: their joint frequency is p^2
    both = (draws[:, -1, 5] & draws[:, -1, 30]).double().mean()
    assert float(both) == pytest.approx(p * p, abs=4 * math.sqrt(p * p / 600))


def test_a_rows_draw_depends_on_its_own_tokens_only_and_a_training_draw_on_seed_layer_and_step():
    spec = AttentionSpec(RANDOM.name, window=W)
    a, b = list(range(3, 40)), list(range(5, 25))
    together = layer_draws(RANDOM, spec, 40, [0, 1], seed=3, rows=[a, b])
    alone = layer_draws(RANDOM, spec, 25, [0, 1], seed=3, rows=[b])
    for layer in range(2):
        got = key_table(together[layer], 40, W, torch.tensor([len(a), len(b)]))[1]
        want = key_table(alone[layer], 25, W, torch.tensor([len(b)]))[0]
        width = max(got.shape[-1], want.shape[-1])
        pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[-1]), value=-1)  # noqa: E731
        assert torch.equal(pad(got)[:25], pad(want)) and (got[25:] == -1).all()  # padding reads nothing
    assert not torch.equal(together[0][0], together[1][0])  # layers draw apart
    assert not torch.equal(layer_draws(RANDOM, spec, 40, [0], seed=4, rows=[a])[0][0], together[0][0])
    from sa_lightning.models import ModelConfig, build_model

    model = build_model(ModelConfig(vocab_size=64, n_layer=2, n_head=2, d_model=32, max_seq_len=64,
                                    attention=AttentionSpec(RANDOM.name, window=W)))
    first, again, other = model.draws(N, 5, "cpu"), model.draws(N, 5, "cpu"), model.draws(N, 6, "cpu")
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])


def test_a_callers_key_table_is_checked_at_the_models_boundary():
    from sa_lightning.models import ModelConfig, build_model

    model = build_model(ModelConfig(vocab_size=64, n_layer=2, n_head=2, d_model=32, max_seq_len=64,
                                    attention=AttentionSpec(RANDOM.name, window=W)))
    idx = torch.randint(0, 64, (2, N))
    draws = model.draws(N, 0, "cpu")
    torch.testing.assert_close(model(idx, perms=draws), model(idx, perm_stream=0))
    future = [d.clone() for d in draws]
    future[1][0] = -5  # a seed outside [0, 2**31)
    with pytest.raises(ValueError, match="must lie in"):
        model(idx, perms=future)
    with pytest.raises(ValueError, match="shape"):  # a key table of the old draw is not a seed
        check_keys(torch.zeros(N, 2, dtype=torch.long), 2, N, torch.device("cpu"))
    with pytest.raises(ValueError, match="shape"):
        check_keys(torch.zeros(3, dtype=torch.long), 2, N, torch.device("cpu"))
    with pytest.raises(ValueError, match="window >= 3"):
        RANDOM.draw(AttentionSpec(RANDOM.name, window=2), N, None, torch.Generator())


def test_the_random_control_reads_about_sas_keys_where_sa_reads_its_band():
    """Keys per query, counted from the masks: the control's expected degree is SA's, so the equal-budget axis
    puts them side by side."""
    spec = AttentionSpec(RANDOM.name, window=W)
    sa_spec = AttentionSpec(SA.name, window=W)
    lengths = torch.tensor([N] * 64)
    (table,) = layer_draws(RANDOM, spec, N, [0], seed=0, lengths=lengths)
    (perm,) = layer_draws(SA, sa_spec, N, [0], seed=0, lengths=lengths)
    ours = RANDOM.keys_attended(spec, N, perm=table, lengths=lengths)
    theirs = SA.keys_attended(sa_spec, N, perm=perm, lengths=lengths)
    assert ours[1] == theirs[1] and ours[0] / theirs[0] == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("name", ["random", "random_swa"])
def test_the_shipped_model_swap_trains(name, tmp_path):
    """``--model configs/model/<name>.yaml`` on the embedded default: a few steps, a finite validation loss."""
    from tests.helpers import run_cli_here

    res = run_cli_here("fit", "--config", "configs/tiny.yaml", "--config", "tests/configs/small.yaml", "--model",
                       f"configs/model/{name}.yaml", "--trainer.default_root_dir", str(tmp_path),
                       "--trainer.enable_progress_bar", "false",
                       '--trainer.callbacks+={"class_path": "tests.helpers.SkipUnusedWork"}')
    assert res.returncode == 0, res.stderr[-2000:]
    assert get_variant(name).draws


@pytest.mark.parametrize("name", ["random", "random_swa", "random_swa_union"])
@pytest.mark.parametrize("padded", [False, True])
def test_the_gather_kernel_matches_the_oracle_where_it_runs_instead_of_the_dense_path(name, padded, monkeypatch):
    """The variants run the n x n path while it fits (``DENSE_ELEMENTS``) and the O(n*K) gather beyond: with the
    threshold at 0, the gather (and the union's window + far keys merge) must give the oracle's outputs and
    gradients too, with its queries in many chunks, each gathering only up to its own last key."""
    from sa_lightning.attention import oracle, random_keys

    monkeypatch.setattr(random_keys, "DENSE_ELEMENTS", 0)
    monkeypatch.setattr(random_keys, "_CHUNK_ELEMENTS", 4096)  # a few queries per chunk, each its own width
    monkeypatch.setattr(random_keys, "_TABLE_ELEMENTS", 1000)  # the table built over several chunks of queries
    variant, n = get_variant(name), 96
    spec = AttentionSpec(name, window=16)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, h, n, 8, generator=g, requires_grad=True) for h in (4, 2, 2))
    lengths = torch.tensor([n, n - 29]) if padded else None
    (table,) = layer_draws(variant, spec, n, [0], seed=2, lengths=lengths if padded else torch.tensor([n, n]))
    valid = torch.ones(2, 1, n, 1) if lengths is None else (torch.arange(n) < lengths.view(2, 1)).view(2, 1, n, 1)
    for out, mask in zip(variant(q, k, v, spec, table, lengths), variant.oracle_masks(spec, q, k, table, lengths)):
        ref = oracle.reference_attention(q.double(), k.double(), v.double(), mask)
        torch.testing.assert_close(out.double() * valid, ref * valid, atol=1e-5, rtol=0)
        w = torch.randn(out.shape, generator=g) * valid
        got = torch.autograd.grad((out * w).sum(), (q, k, v), retain_graph=True)
        want = torch.autograd.grad((ref * w.double()).sum(), (q, k, v))
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b.double(), atol=1e-5, rtol=0)


def test_each_chunk_gathers_up_to_its_own_last_key_and_the_full_width_gives_the_same():
    """Early queries read about p * i keys, so a chunk of them gathers fewer columns than the table's width; where a
    step must not sync (a gradient on an accelerator, a compiled graph) every chunk takes the full width instead,
    with the same outputs and gradients."""
    from sa_lightning.attention import random_keys

    n, spec = 96, AttentionSpec(RANDOM.name, window=16)
    lengths = torch.tensor([n, n - 29])
    table = key_table(random_keys.draw_keys(spec, n, lengths, torch.Generator().manual_seed(3)), n, 16, lengths)
    idx = torch.cat([torch.arange(n).view(1, n, 1).expand(2, n, 1), table], -1)
    starts = list(range(0, n, 8))
    widths = random_keys._chunk_widths(idx >= 0, starts, 8)
    assert widths[0] < idx.shape[-1] == max(widths) and widths[0] <= widths[-1]
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, h, n, 8, generator=g, requires_grad=True) for h in (4, 2, 2))

    def run():
        out, lse = random_keys.random_attention(q, k, v, table, scale=8 ** -0.5)
        return (out, lse, *torch.autograd.grad(out.square().sum(), (q, k, v)))

    trimmed = run()
    full = random_keys._chunk_widths
    try:
        random_keys._chunk_widths = lambda valid, starts, chunk: [valid.shape[-1]] * len(starts)
        wide = run()
    finally:
        random_keys._chunk_widths = full
    for a, b in zip(trimmed, wide):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_the_route_follows_the_measured_crossover_with_and_without_a_backward_pass():
    """The n x n path has no backward to share its cost with in inference: there the gather runs once a row is
    3.5 to 6.5 times the keys a query reads (by how many query heads share a kv head), in training once it is
    TRAINING_RATIO times (a 2048-token prefill at w = 32: 15x faster gathered; a training step at n = 256, w = 16:
    2.4x faster n x n; docs/benchmarks.md), and always once the n x n scores would not fit."""
    from sa_lightning.attention.random_keys import DENSE_ELEMENTS, TRAINING_RATIO, dense_is_cheaper

    long, short = torch.zeros(1, 9, 2048, 4), torch.zeros(1, 9, 128, 4)
    with torch.no_grad():
        assert not dense_is_cheaper(long, 32, 3) and dense_is_cheaper(short, 64, 3)
        assert dense_is_cheaper(long, int(2048 / 3.5) + 1, 3)          # SmolLM2's groups of three: 3.5 x K
        assert not dense_is_cheaper(long, int(2048 / 3.5) - 1, 3)
        # without groups the gather fetches a key per query head: n x n up to about 6.5 x K (measured: n = 192,
        # K about 45, 16.9 ms against 35.8 gathered; n = 320: 54.5 against 42.5)
        tiny = torch.zeros(16, 4, 192, 32)
        assert dense_is_cheaper(tiny, 45, 4) and not dense_is_cheaper(tiny, 45, 1)
        assert not dense_is_cheaper(torch.zeros(16, 4, 320, 32), 45, 4)
    assert 6.5 < TRAINING_RATIO
    row = torch.zeros(1, 2, 256, 4, requires_grad=True)
    assert dense_is_cheaper(row, 26)                                   # training at n = 256, w = 16: n x n
    with torch.no_grad():
        assert not dense_is_cheaper(row, 26)                           # the same row in inference: the gather
    assert not dense_is_cheaper(long.requires_grad_(), 32)             # a long row in training: the gather
    huge = torch.zeros(1, DENSE_ELEMENTS // 2048 ** 2 + 1, 2048, 1, requires_grad=True)
    assert not dense_is_cheaper(huge, 2048)                            # scores that would not fit: the gather


def test_a_short_padded_row_that_reads_every_key_draws_nothing_for_its_padding():
    """A row of 10 tokens at w = 32 reads all its earlier keys (p = 1); its padding queries draw no keys, so the
    table stays about w wide instead of growing with the batch's width n."""
    spec, lengths = AttentionSpec(RANDOM.name, window=32), torch.tensor([10, 2048])
    table = key_table(RANDOM.draw(spec, 2048, lengths, torch.Generator().manual_seed(0)), 2048, 32, lengths)
    assert table.shape[-1] < 100
    assert torch.equal((table[0, :10] >= 0).sum(-1), torch.arange(10)) and (table[0, 10:] == -1).all()


def test_every_path_reads_one_hash_and_nothing_n_by_n_is_drawn():
    """The draw is a seed per row (its shape fixed, so a compiled step never retraces for it); the mask function
    (FlexAttention's and the dense paths'), the CPU kernels' key table and the oracle (numpy's uint64) give the
    same pairs, padded rows included, and the hash's bits are uniform: every pair's rate is its row's p."""
    from sa_lightning.attention import masks

    lengths = torch.tensor([300, 211, 2])
    seeds = RANDOM.draw(AttentionSpec(RANDOM.name, window=32), 300, lengths, torch.Generator().manual_seed(5))
    assert seeds.shape == (3,) and seeds.dtype == torch.int64
    want = random_mask(seeds, 32, 3, 300, lengths)[:, 0]
    got = masks.dense(masks.random_keys(seeds, 32, 300, lengths), 300, batch=3)[:, 0]
    # evaluated a few query rows at a time (bounded temporaries on a large grid), or a row at a time: the same grid
    assert torch.equal(masks.dense(masks.random_keys(seeds, 32, 300, lengths), 300, batch=3, chunk=3 * 300 * 7)[:, 0],
                       got)
    shared = masks.dense(masks.sliding_window(16), 300, batch=3, heads=2, chunk=1)
    assert shared.shape == (3, 2, 300, 300) and torch.equal(shared, masks.dense(masks.sliding_window(16), 300, 3, 2))
    table = key_table(seeds, 300, 32, lengths)
    scattered = torch.zeros(3, 300, 301, dtype=torch.bool).scatter_(2, torch.where(table < 0, 300, table), True)
    assert torch.equal(got, want) and torch.equal(scattered[..., :300] | torch.eye(300, dtype=torch.bool), want)
    assert (table >= 0).sum(-1)[2].max() == 1 and (table[1, 211:] == -1).all()  # L = 2: the one earlier key
    # an accelerator's way (the width counted first, read back once, then the table): the same table
    assert torch.equal(key_table(seeds, 300, 32, lengths, one_read_back=True), table)
    bits = masks.pair_hash(torch.tensor(7), torch.arange(512).view(-1, 1), torch.arange(512).view(1, -1))
    assert int(bits.min()) >= 0 and int(bits.max()) < 2 ** 32
    top = torch.bincount((bits >> 28).view(-1), minlength=16).double()  # the high bits the threshold reads
    assert float(((top - top.mean()) ** 2 / top.mean()).sum()) < 45  # chi-square, 15 dof: p < 1e-4 above 45
