"""A layer run in slot order (``attention.slots``, issue 65 item 1): the model permutes each layer's rows once
instead of q, k, v and the output, gives the same logits and gradients as the kernels' own reorders, and moves
at most half their bytes."""
import dataclasses

import pytest
import torch

from sa_lightning.attention import flex, get_variant, masks
from sa_lightning.attention.dense import dense_masked_attention
from sa_lightning.attention.permutation import counting_moves
from sa_lightning.models import ModelConfig, Transformer


@pytest.fixture
def flex_standin(monkeypatch):
    """FlexAttention's SA-in-slots kernel replaced by the n x n path of the same mask function, so that SA's flex
    route (its reorders, or the slot path) runs forward and backward on a CPU (FlexAttention has no CPU
    backward); the kernel itself is checked against the oracle in ``test_attention_flex``."""
    def standin(qs, ks, vs, pos, window, *, scale, compiled=True):
        mask = masks.dense(masks.stochastic_in_slots(pos, window), qs.shape[2], batch=qs.shape[0], device=qs.device)
        return dense_masked_attention(qs, ks, vs, mask, scale=scale)

    monkeypatch.setattr(flex, "sa_flex_slots", standin)


def _models(variant: str, backend: str, **size):
    """The model, and a twin with the same weights whose layers reorder inside the kernels (no slot path)."""
    cfg = ModelConfig.from_name("tiny", variant=variant, backend=backend, window=16, max_seq_len=96, n_layer=2,
                                d_model=64, n_head=4, **size)
    torch.manual_seed(0)
    model = Transformer(cfg).double()
    twin = Transformer(cfg).double()
    twin.load_state_dict(model.state_dict())
    plain = dataclasses.replace(get_variant(variant), slot_kernel=None)
    for block in twin.blocks:
        block.attn.variant = plain
    return cfg, model, twin


def _step(model, idx, perms, lengths=None):
    model.zero_grad(set_to_none=True)
    logits = model(idx, perms=perms, lengths=lengths)
    valid = torch.ones_like(idx, dtype=torch.bool) if lengths is None else (
        torch.arange(idx.shape[1])[None] < lengths[:, None])
    (logits.sum(-1) * valid).sum().backward()
    return logits[valid], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant,backend,n,kv,padded", [
    ("sa", "flex", 80, 4, False),            # SA's flex route (its kernel stood in for on the CPU)
    ("sa_fixed", "flex", 64, 2, False),      # its fixed-σ twin, grouped-query keys and values
    ("sa_bucket", "banded", 70, 4, False),   # buckets through SDPA; 70 tokens fill the last bucket up with spares
    ("sa_bucket", "banded", 70, 2, True),    # right-padded rows and grouped-query keys and values
])
def test_a_layer_in_slot_order_matches_the_kernels_reorders_forward_and_backward(variant, backend, n, kv, padded,
                                                                                 flex_standin):
    cfg, model, twin = _models(variant, backend, n_kv_head=kv)
    assert model.blocks[0].attn.variant.runs_in_slots(cfg.attention, torch.zeros(1, n, 64), cfg.head_dim,
                                                      torch.tensor([n]) if padded else None)
    B = 3
    idx = torch.randint(0, cfg.vocab_size, (B, n))
    lengths = torch.tensor([n, n - 9, 23]) if padded else None
    perms = model.draws(n, 0, idx.device, lengths)
    got, grads = _step(model, idx, perms, lengths)
    want, want_grads = _step(twin, idx, perms, lengths)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    assert grads.keys() == want_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=1e-10, rtol=1e-10, msg=name)


def test_sa_takes_the_slot_path_only_where_its_kernel_runs_there():
    sa, x = get_variant("sa"), torch.zeros(1, 8, 64)
    spec = ModelConfig.from_name("tiny", variant="sa", window=16).attention
    assert not sa.runs_in_slots(spec, x, 16)  # auto on a CPU: the banded kernel, which reorders in its gathers
    assert not sa.runs_in_slots(dataclasses.replace(spec, backend="dense"), x, 16)  # reorders nothing
    assert sa.runs_in_slots(dataclasses.replace(spec, backend="flex"), x, 16)
    assert not sa.runs_in_slots(dataclasses.replace(spec, backend="flex"), x, 16, torch.tensor([8]))  # padding
    assert not get_variant("swa").runs_in_slots(spec, x, 16)


@pytest.mark.parametrize("variant,backend", [("sa", "flex"), ("sa_bucket", "banded")])
def test_the_slot_path_moves_at_most_half_the_bytes_of_the_kernels_reorders(variant, backend, flex_standin):
    """Measured by the reorders' own tally (``counting_moves``), forward and backward, on one training step."""
    cfg, model, twin = _models(variant, backend)
    idx = torch.randint(0, cfg.vocab_size, (2, 90))
    perms = model.draws(90, 0, idx.device)
    moved = {}
    for name, m in (("slots", model), ("kernels", twin)):
        with counting_moves() as tally:
            _step(m, idx, perms)
        moved[name] = dict(tally)
    slots, kernels = moved["slots"], moved["kernels"]
    # 2 layers: q, k, v and the output each way (8 copies a layer), against the layer's rows in and out (4)
    assert (kernels["copies"], slots["copies"]) == (16, 8), moved
    assert 0 < slots["data"] <= kernels["data"] / 2, moved
    assert slots["index"] < 0.1 * slots["data"], moved  # the indices: a row each, beside rows of C numbers


@pytest.mark.gpu
def test_sa_on_flex_in_slot_order_matches_the_kernels_reorders_on_cuda():
    cfg = ModelConfig.from_name("tiny", variant="sa", backend="flex", window=64, max_seq_len=1024, n_layer=2)
    torch.manual_seed(0)
    model, twin = Transformer(cfg).cuda(), Transformer(cfg).cuda()
    twin.load_state_dict(model.state_dict())
    plain = dataclasses.replace(get_variant("sa"), slot_kernel=None)
    for block in twin.blocks:
        block.attn.variant = plain
    idx = torch.randint(0, cfg.vocab_size, (2, 1024), device="cuda")
    perms = model.draws(1024, 0, idx.device)
    got, grads = _step(model, idx, perms)
    want, want_grads = _step(twin, idx, perms)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    for name in grads:
        torch.testing.assert_close(grads[name], want_grads[name], atol=2e-3, rtol=2e-3, msg=name)
