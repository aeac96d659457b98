"""Bad input, permutations, the registry, the gate, and the O(n*w) memory contract."""
import numpy as np
import pytest

from tests.helpers import LargestTensor
import torch

from sa_lightning.attention import (
    VARIANTS,
    AttentionSpec,
    GatedPaths,
    get_variant,
    invert_permutation,
    layer_generator,
    moba_attention,
    sample_permutation,
    sliding_window_attention,
    stochastic_attention,
    full_attention,
)
from sa_lightning.attention import masks


def _qkv(n=16, hq=4, hkv=2, d=8, b=2):
    return torch.randn(b, hq, n, d), torch.randn(b, hkv, n, d), torch.randn(b, hkv, n, d)


@pytest.mark.parametrize("call,name", [
    (lambda q, k, v: sliding_window_attention(q, k, v, 0), "window"),
    (lambda q, k, v: stochastic_attention(q, k, v, -3), "window"),
    (lambda q, k, v: moba_attention(q, k, v, 0, 2), "block_size"),
    (lambda q, k, v: moba_attention(q, k, v, 4, 0), "top_k"),
])
def test_bad_sizes_name_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call(*_qkv())


#: every public attention function, called with small valid sizes
PUBLIC_CALLS = [
    lambda q, k, v: full_attention(q, k, v),
    lambda q, k, v: sliding_window_attention(q, k, v, 4),
    lambda q, k, v: stochastic_attention(q, k, v, 4),
    lambda q, k, v: moba_attention(q, k, v, 4, 2),
]


@pytest.mark.parametrize("shapes,needle", [
    (((2, 4, 16, 8), (3, 2, 16, 8), (3, 2, 16, 8)), "batch"),
    (((2, 4, 16, 8), (2, 2, 15, 8), (2, 2, 15, 8)), "length"),
    (((2, 4, 16, 8), (2, 2, 16, 4), (2, 2, 16, 4)), "head dim"),
    (((2, 4, 16, 8), (2, 3, 16, 8), (2, 3, 16, 8)), "divisible"),
    (((2, 4, 16, 8), (2, 2, 16, 8), (2, 1, 16, 8)), "same shape"),
    (((4, 16, 8), (2, 2, 16, 8), (2, 2, 16, 8)), "q must be a 4-D"),
])
@pytest.mark.parametrize("fn", PUBLIC_CALLS)
def test_bad_shapes(shapes, needle, fn):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=needle):
        fn(q, k, v)


@pytest.mark.parametrize("make,needle", [
    (lambda: torch.randn(2, 4, 16, 0), "head dim"),
    (lambda: torch.randint(0, 5, (2, 4, 16, 8)), "floating point"),
    (lambda: torch.randint(0, 5, (2, 4, 16, 8), dtype=torch.uint8), "floating point"),
    (lambda: torch.zeros(2, 4, 16, 8, dtype=torch.bool), "floating point"),
])
@pytest.mark.parametrize("fn", PUBLIC_CALLS)
def test_empty_head_dim_and_non_float_inputs_are_refused_in_one_sentence(make, needle, fn):
    q = make()
    with pytest.raises(ValueError, match=needle):
        fn(q, q.clone(), q.clone())


@pytest.mark.parametrize("window", [np.int64(8), np.int32(8), torch.tensor(8)])
def test_numpy_and_tensor_integers_are_integers(window):
    q, k, v = _qkv()
    torch.testing.assert_close(sliding_window_attention(q, k, v, window), sliding_window_attention(q, k, v, 8))
    spec = AttentionSpec("sa", window=window, block_size=np.int64(4))
    assert type(spec.window) is int and spec.window == 8 and type(spec.block_size) is int
    for bad in (8.0, np.float64(8), torch.tensor(8.0), True, torch.tensor(True)):
        with pytest.raises(ValueError, match="window must be an integer"):
            sliding_window_attention(q, k, v, bad)


def test_devices_must_match():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="one device"):
        sliding_window_attention(q, k.to("meta"), v, 4)


@pytest.mark.parametrize("perm,needle", [
    (torch.arange(15), "shape"),
    (torch.arange(16).repeat(3, 1), "shape"),
    (torch.tensor([0] * 16), "duplicate"),
    (torch.arange(1, 17), r"\[0, 15\]"),
    (torch.arange(16) - 1, r"\[0, 15\]"),
    (torch.arange(16).float(), "integers"),
    (torch.stack([torch.arange(16), torch.arange(16).flip(0) * 0]), "duplicate"),
])
def test_bad_permutations_name_perm(perm, needle):
    with pytest.raises(ValueError, match=f"perm.*{needle}|{needle}.*perm"):
        stochastic_attention(*_qkv(), 4, perm)


def test_permutations_are_seedable_and_shaped():
    a = sample_permutation(100, generator=torch.Generator().manual_seed(1))
    b = sample_permutation(100, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and torch.equal(a.sort().values, torch.arange(100))
    rows = sample_permutation(50, batch=3, generator=torch.Generator().manual_seed(2))
    assert rows.shape == (3, 50) and not torch.equal(rows[0], rows[1])
    assert torch.equal(rows.sort(-1).values, torch.arange(50).expand(3, 50))
    inv = invert_permutation(rows)
    assert torch.equal(torch.gather(inv, 1, rows), torch.arange(50).expand(3, 50))


def test_layer_generators_are_independent_and_reproducible():
    draw = lambda seed, layer: sample_permutation(64, generator=layer_generator(seed, layer))  # noqa: E731
    assert torch.equal(draw(0, 3), draw(0, 3))
    assert not torch.equal(draw(0, 3), draw(0, 4)) and not torch.equal(draw(0, 3), draw(1, 3))


def test_sa_window_sizes_match_design():
    """The paper's mask holds 2*ceil(w/2) - 1 slots: w - 1 for even w, w for odd w."""
    n = 101
    slot = torch.arange(n).view(1, n)
    for w in (1, 2, 3, 8, 9, 32):
        mask = masks.dense(masks.stochastic(slot, w), n)[0, 0]
        # the last token sees every causal neighbour within the circular window of its slot
        near = (masks.circular_distance(torch.arange(n), torch.tensor(50), n) <= masks.sa_half_width(w)).sum()
        assert near == 2 * -(-w // 2) - 1
        assert bool(mask[50, 50]) and mask[50].sum() == (near + 1) // 2


def test_registry_names_and_errors():
    assert set(VARIANTS) == {"full", "swa", "sa", "sa_fixed", "sa_swa", "sa_swa_union", "moba", "strided",
                             "strided_swa", "strided_swa_union", "strided_local", "strided_local_swa",
                             "strided_local_swa_union", "random", "random_swa", "random_swa_union", "sa_bucket",
                             "sa_bucket_swa_union", "sa_bucket_swa", "radix"}
    assert get_variant("sa_swa").paths == ("sa", "swa") and get_variant("sa").uses_permutation
    with pytest.raises(ValueError, match="unknown attention variant 'sa-swa'.*sa_swa"):
        get_variant("sa-swa")
    with pytest.raises(ValueError, match="window"):
        AttentionSpec("sa", window=0)
    with pytest.raises(ValueError, match="backend"):
        get_variant("sa")(*_qkv(), AttentionSpec("sa", window=4, backend="cuda-magic"))


def test_registry_masks_match_kernels():
    """The registry's mask functions describe exactly what its kernels compute."""
    from sa_lightning.attention import oracle

    q, k, v = _qkv(n=40)
    perm = sample_permutation(40, generator=torch.Generator().manual_seed(0))
    for name in ("full", "swa", "sa"):
        spec = AttentionSpec(name, window=6)
        variant = get_variant(name)
        mask = masks.dense(variant.mask(spec, 40, perm), 40, batch=2)
        (out,) = variant(q, k, v, spec, perm)
        torch.testing.assert_close(out, oracle.reference_attention(q, k, v, mask), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["sa", "sa_swa", "sa_swa_union"])
@pytest.mark.parametrize("grad", [False, True])
def test_precomputed_inverse_gives_the_same_outputs(name, grad):
    """A caller may pass sigma^-1 with sigma (the benchmark precomputes both); nothing changes."""
    q, k, v = (t.requires_grad_(grad) for t in _qkv(n=64))
    perm = sample_permutation(64, batch=2, generator=torch.Generator().manual_seed(3))
    spec, variant = AttentionSpec(name, window=8), get_variant(name)
    with torch.set_grad_enabled(grad):
        mine = variant(q, k, v, spec, perm)
        given = variant(q, k, v, spec, perm, None, invert_permutation(perm))
    for a, b in zip(mine, given):
        assert torch.equal(a, b)


def test_gate_single_and_dual_path():
    torch.manual_seed(0)
    one = GatedPaths(8)
    y = torch.randn(2, 5, 8)
    torch.testing.assert_close(one(y), torch.sigmoid(y @ one.gates["attn"].weight.T) * y)
    two = GatedPaths(8, ("sa", "swa"))
    y_sa, y_swa = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    want = torch.sigmoid(y_sa @ two.gates["sa"].weight.T) * y_sa + torch.sigmoid(y_swa @ two.gates["swa"].weight.T) * y_swa
    torch.testing.assert_close(two(y_sa, y_swa), want)
    assert sum(p.numel() for p in two.parameters()) == 2 * 8 * 8
    with pytest.raises(ValueError, match="expects 2 outputs"):
        two(y_sa)


@pytest.mark.parametrize("variant", ["swa", "sa", "sa_swa", "moba", "sa_bucket", "sa_bucket_swa_union"])
def test_no_n_by_n_tensor(variant):
    """Forward and backward at n=4096, w=64 never hold a tensor of n*n elements (per head)."""
    n, hq = 4096, 1
    q, k, v = (torch.randn(1, hq, n, 8, requires_grad=True) for _ in range(3))
    spec = AttentionSpec(variant, window=64, block_size=32, top_k=2)
    perm = sample_permutation(n)
    with LargestTensor() as probe:
        outs = get_variant(variant)(q, k, v, spec, perm)
        sum(o.sum() for o in outs).backward()
    assert probe.largest < n * n // 8, f"{variant} made a tensor of {probe.largest} elements"


@pytest.mark.parametrize("lengths,word", [
    (torch.tensor([4, 0]), "lengths"), (torch.tensor([4, 9]), "lengths"), (torch.tensor([4]), "lengths"),
    (torch.tensor([4.0, 2.0]), "lengths"),
])
def test_bad_lengths_name_the_argument(lengths, word):
    q = k = v = torch.randn(2, 1, 8, 4)
    with pytest.raises(ValueError, match=word):
        stochastic_attention(q, k, v, 4, torch.arange(8), lengths=lengths)


@pytest.mark.slow  # a fresh interpreter per case
@pytest.mark.parametrize("case", ["import", "tuned", "optout"])
def test_the_kernels_malloc_tuning_is_a_call_never_an_import(case):
    """``import sa_lightning.attention`` changes nothing in the process (glibc's defaults: every reuse of a
    freed score buffer is a fresh mmap); ``tune_cpu_allocator()``, which the command line calls and a script of
    your own may call, makes malloc recycle them, so a kernel runs as fast from Python as from ``cli.py``; the
    opt-out is respected."""
    import os
    import subprocess
    import sys

    tune = "" if case == "import" else \
        "from sa_lightning.utils.cpu_allocator import tune_cpu_allocator; tune_cpu_allocator()\n"
    probe = (
        "import resource, torch, sa_lightning.attention\n" + tune +
        "for _ in range(4):\n"  # the heap settles first: count the reuses only
        "    x = torch.empty(1 << 24).fill_(1.0); del x\n"
        "t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(16):\n"
        "    x = torch.empty(1 << 24).fill_(1.0); del x\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - t0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SA_LIGHTNING_DEFAULT_MALLOC"}
    if case == "optout":
        env["SA_LIGHTNING_DEFAULT_MALLOC"] = "1"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    faults, pages = int(out.stdout.split()[-1]), (1 << 24) * 4 // 4096  # one 64 MiB buffer's pages
    # tuned, 0-4 of the 16 reuses still fault on a fresh mmap (where the imports left the heap: 0-7 with the .pyc
    # files compiled anew); untuned, all 16 do
    if case == "tuned":
        assert faults < 8 * pages  # a few first touches, not one per reuse
    else:
        assert faults > 12 * pages  # glibc's default: every reuse is a fresh mmap


@pytest.mark.parametrize("rows", [1, 3])
def test_permute_tokens_is_a_gather_whose_backward_copies_by_the_inverse(rows):
    """Bucketed SA reorders q, k, v and the output through ``permute_tokens``: the values of a gather, and the
    gradient of one, without a scatter-add; spare trailing entries get no gradient."""
    from sa_lightning.attention.permutation import permute_tokens

    g = torch.Generator().manual_seed(rows)
    x = torch.randn(3, 2, 10, 4, generator=g, dtype=torch.float64, requires_grad=True)
    perm = torch.stack([torch.randperm(10, generator=g) for _ in range(rows)])
    inv = invert_permutation(perm)
    want = torch.take_along_dim(x, perm.expand(3, -1)[:, None, :, None], dim=2)
    got = permute_tokens(x, perm[0] if rows == 1 else perm, inv[0] if rows == 1 else inv)
    assert torch.equal(got, want)
    w = torch.randn(got.shape, generator=g, dtype=torch.float64)
    assert torch.equal(torch.autograd.grad((got * w).sum(), x)[0],
                       torch.autograd.grad((want * w).sum(), x, retain_graph=True)[0])
    # two spare entries repeating row 9 at the end: their gradient is dropped (even where the loss weighs them),
    # the real rows' is exact; and the other way, output rows from `valid` on get no gradient
    spare = torch.cat([perm.expand(3, -1), torch.full((3, 2), 9)], 1)
    got = permute_tokens(x, spare, inv.expand(3, -1))
    assert torch.equal(got[:, :, :10], want) and torch.equal(got[:, :, 10:], x[:, :, [9, 9]])
    heavy = torch.cat([w, torch.full((3, 2, 2, 4), 5.0, dtype=torch.float64)], 2)
    assert torch.equal(torch.autograd.grad((got * heavy).sum(), x)[0],
                       torch.autograd.grad((want * w).sum(), x, retain_graph=True)[0])
    y = torch.randn(3, 2, 12, 4, generator=g, dtype=torch.float64, requires_grad=True)  # 10 real rows, 2 spare
    back = permute_tokens(y, inv.expand(3, -1), spare, 10)
    assert torch.equal(back, torch.take_along_dim(y, inv.expand(3, -1)[:, None, :, None], dim=2))
    (dy,) = torch.autograd.grad((back * w).sum(), y)
    assert torch.equal(dy[:, :, 10:], torch.zeros(3, 2, 2, 4, dtype=torch.float64))
    assert torch.equal(dy[:, :, :10], torch.take_along_dim(w, perm.expand(3, -1)[:, None, :, None], dim=2))
