"""The FlexAttention path: block-mask structure and eager forward on CPU; compiled paths on GPU."""
import pytest
import torch

from sa_lightning.attention import (
    AttentionSpec,
    get_variant,
    masks,
    sample_permutation,
    sliding_window_attention,
    stochastic_attention,
)
from sa_lightning.attention import flex, oracle
from sa_lightning.attention.permutation import gather_tokens, invert_permutation


def _qkv(n, device="cpu", dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(n)
    make = lambda h: torch.randn(2, h, n, 16, generator=g).to(device, dtype).requires_grad_(grad)  # noqa: E731
    return make(4), make(2), make(2)


@pytest.mark.parametrize("n,w", [(300, 16), (700, 64), (1100, 256), (2048, 256), (200, 400)])
def test_cached_block_mask_covers_the_sa_band(n, w):
    """Every slot pair inside the circular band lies in a visited block."""
    half = masks.sa_half_width(w)
    if 2 * half + 1 >= n:
        bm = flex.band_block_mask(n, n, n, False, 128, "cpu")
    else:
        bm = flex.band_block_mask(n, half, half, True, 128, "cpu")
    slots = torch.arange(n)
    band = masks.circular_distance(slots.view(-1, 1), slots.view(1, -1), n) <= half
    nb = bm.kv_num_blocks.shape[-1]
    pad = nb * 128 - n
    covered = torch.nn.functional.pad(band, (0, pad, 0, pad)).view(nb, 128, nb, 128).any(3).any(1)
    visited = bm.to_dense()[0, 0].bool()
    assert bool((visited | ~covered).all()), "a block holding in-band pairs is skipped"
    assert bm.full_kv_num_blocks is None  # every block stays partial: the mask_mod decides
    first, again = (flex.band_block_mask(n, half, half, True, 128, "cpu") for _ in range(2))
    assert first.kv_indices is again.kv_indices  # the block tables are built once per shape


@pytest.mark.parametrize("per_row", [False, True])
def test_eager_flex_matches_oracle(per_row):
    n, w = 700, 64
    q, k, v = _qkv(n)
    perm = sample_permutation(n, batch=2 if per_row else None, generator=torch.Generator().manual_seed(5))
    pos = perm if per_row else perm.unsqueeze(0)
    qs, ks, vs = (gather_tokens(t, perm) for t in (q, k, v))
    y = gather_tokens(flex.sa_flex_slots(qs, ks, vs, pos, w, scale=0.25, compiled=False), invert_permutation(perm))
    torch.testing.assert_close(y, oracle.reference_attention(q, k, v, oracle.sa_mask(perm, w, 2), 0.25), atol=1e-5, rtol=0)
    y = flex.swa_flex(q, k, v, w, scale=0.25, compiled=False)
    torch.testing.assert_close(y, oracle.reference_attention(q, k, v, oracle.swa_mask(n, w), 0.25), atol=1e-5, rtol=0)


@pytest.mark.parametrize("n,block,top_k,heads", [(300, 32, 3, (4, 2)), (257, 128, 4, (4, 1)), (1000, 200, 3, (2, 2)),
                                                  (500, 48, 5, (2, 2)), (40, 64, 2, (2, 2))])
def test_moba_flex_block_mask_covers_every_pick_and_matches_oracle(n, block, top_k, heads):
    """The block mask built from the picks visits every tile that holds a readable key, and the eager
    FlexAttention forward equals the float64 oracle over the selection's mask."""
    from sa_lightning.attention import moba

    g = torch.Generator().manual_seed(n)
    q = torch.randn(2, heads[0], n, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, heads[1], n, 16, generator=g, dtype=torch.float64) for _ in range(2))
    selection = moba.moba_selection(q, k, block, top_k)
    picks = moba.picks_per_head(selection, q)
    bm = flex.moba_block_mask(picks, block)
    readable = masks.dense(masks.moba_picks(picks, block), n, batch=2, heads=heads[0])
    nt = bm.kv_num_blocks.shape[-1]
    pad = nt * 128 - n
    covered = torch.nn.functional.pad(readable, (0, pad, 0, pad)).view(2, heads[0], nt, 128, nt, 128).any(5).any(3)
    assert bool((bm.to_dense().bool() | ~covered).all()), "a tile holding a readable key is skipped"
    ref = oracle.reference_attention(q, k, v, oracle.moba_mask(q, k, block, top_k), 0.25)
    y = flex.moba_flex(q.float(), k.float(), v.float(), picks, block, scale=0.25, compiled=False)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n,w,per_row,union", [(300, 16, False, False), (700, 64, True, False),
                                                (257, 32, True, True), (1000, 96, False, True), (40, 8, True, False)])
def test_random_keys_flex_matches_oracle(n, w, per_row, union):
    """The random-keys control (and its union with SWA) on FlexAttention, CUDA's route: its block mask visits
    every tile holding a readable pair, and the eager forward equals the float64 oracle over the drawn table,
    padded rows included (row 1 holds n - 17 valid tokens): one hash, evaluated tile by tile, no table."""
    from sa_lightning.attention import VARIANTS

    name = "random_swa_union" if union else "random"
    spec = AttentionSpec(name, window=w)
    lengths = torch.tensor([n, n - 17]) if per_row else None
    seeds = VARIANTS[name].draw(spec, n, lengths, torch.Generator().manual_seed(n))
    q, k, v = _qkv(n)
    size = flex.bucket(n)
    bm = flex.keys_block_mask(seeds, w, n, size, lengths, w if union else 0)
    mask = (oracle.random_swa_union_mask(seeds, w, 2, n, lengths) if union
            else oracle.random_mask(seeds, w, 2, n, lengths))
    nt = bm.kv_num_blocks.shape[-1]
    pad = nt * 128 - n
    covered = torch.nn.functional.pad(mask[:, 0], (0, pad, 0, pad)).view(2, nt, 128, nt, 128).any(4).any(2)
    assert bool((bm.to_dense()[:, 0].bool() | ~covered).all()), "a tile holding a readable key is skipped"
    y = flex.keys_flex(q, k, v, seeds, w, lengths=lengths, scale=0.25, window=w if union else 0, compiled=False)
    ref = oracle.reference_attention(q.double(), k.double(), v.double(), mask, 0.25)
    torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=0)


def test_auto_backend_avoids_flex_below_its_head_dim():
    """FlexAttention's CUDA kernel needs d >= 16: auto picks the banded kernels below it, and an explicit flex
    says so in one sentence (checked on a meta-free stand-in: resolve_backend reads only is_cuda and the shape)."""
    from sa_lightning.attention import VARIANTS

    class CudaLike:
        is_cuda = True

        def __init__(self, d):
            self.shape = (1, 1, 8, d)

    sa = VARIANTS["sa"]
    assert sa.resolve_backend("auto", CudaLike(8)) == "banded"
    assert sa.resolve_backend("auto", CudaLike(16)) == "flex"
    assert VARIANTS["random_swa"].resolve_backend("auto", CudaLike(64)) == "flex"  # both of its paths run there
    with pytest.raises(ValueError, match="head dim of at least 16"):
        sa.resolve_backend("flex", CudaLike(8))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("variant", ["swa", "sa", "random", "random_swa_union"])
def test_cuda_flex_forward_backward(variant, dtype, tol):
    """Each variant where a GPU user trains it (auto -> flex on CUDA), at Table 2's window, forward and backward
    against the oracle over its own draw (σ per row, or the random control's hash seeds)."""
    n, w = 2048, 256
    q, k, v = _qkv(n, "cuda", dtype, grad=True)
    spec = AttentionSpec(variant, window=w)
    found = get_variant(variant)
    drawn = found.draw(spec, n, torch.full((2,), n), torch.Generator().manual_seed(0)).cuda() if found.draws else None
    (y,) = found(q, k, v, spec, drawn)
    (mask,) = found.oracle_masks(spec, q, k, drawn)
    ref = oracle.reference_attention(q, k, v, mask)
    torch.testing.assert_close(y.float(), ref.float(), atol=tol, rtol=0)
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        torch.testing.assert_close(a.float(), b.float(), atol=10 * tol, rtol=0)


@pytest.mark.gpu
def test_cuda_banded_matches_flex():
    n, w = 4096, 256
    q, k, v = _qkv(n, "cuda", grad=True)
    perm = sample_permutation(n, device="cuda")
    a = stochastic_attention(q, k, v, w, perm, backend="banded")
    b = stochastic_attention(q, k, v, w, perm, backend="flex")
    torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    a = sliding_window_attention(q, k, v, w, backend="banded")
    b = sliding_window_attention(q, k, v, w, backend="flex")
    torch.testing.assert_close(a, b, atol=2e-5, rtol=0)


@pytest.mark.slow  # compiles (Inductor, with its compile workers)
def test_compiled_flex_cpu_forward_compiles_once_per_length_bucket():
    """Documents of many lengths (a prefill sweep, an evaluation) run at bucketed lengths: three lengths in
    one bucket compile one graph per variant, and each stays exact against the float64 oracle. New
    permutations swap the mask_mod only: one graph serves every draw, batched or not."""
    from torch._dynamo.utils import counters

    w = 64
    assert {flex.bucket(n) for n in (300, 333, 384)} == {384}
    before = counters["stats"]["unique_graphs"]
    for n in (300, 333, 384):
        q, k, v = _qkv(n)
        perm = sample_permutation(n, batch=2, generator=torch.Generator().manual_seed(n))
        y = stochastic_attention(q, k, v, w, perm, backend="flex")
        torch.testing.assert_close(y, oracle.reference_attention(q, k, v, oracle.sa_mask(perm, w, 2)), atol=1e-5, rtol=0)
        y = sliding_window_attention(q, k, v, w, backend="flex")
        torch.testing.assert_close(y, oracle.reference_attention(q, k, v, oracle.swa_mask(n, w)), atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] - before <= 2  # SA's and SWA's, each once
    before = counters["stats"]["unique_graphs"]
    q, k, v = _qkv(384)
    for seed in range(3):  # one permutation for the whole batch, a fresh one each time
        perm = sample_permutation(384, generator=torch.Generator().manual_seed(seed))
        y = stochastic_attention(q, k, v, w, perm, backend="flex")
        torch.testing.assert_close(y, oracle.reference_attention(q, k, v, oracle.sa_mask(perm, w, 2)), atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] - before <= 1


@pytest.mark.parametrize("n", [1, 100, 128, 129, 192, 193, 256, 257, 384, 385, 2048, 3000])
def test_length_buckets_pad_at_most_a_third(n):
    size = flex.bucket(n)
    assert size >= max(n, flex.BLOCK) and (n <= flex.BLOCK or size - n < size / 3 + 1)
    assert flex.bucket(size) == size  # a bucket length runs unpadded (training at 2^k pads nothing)
