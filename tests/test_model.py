"""The Transformer++ of Appendix B: parameter counts, RoPE before permutation, causality, seeding."""
import pytest
import torch

from sa_lightning.attention import VARIANTS, AttentionSpec, get_variant
from sa_lightning.models import ModelConfig, Transformer

SMALL = dict(vocab_size=97, n_layer=2, n_head=4, d_model=32, max_seq_len=64)
ATT = dict(window=8, block_size=8)


def _cfg(variant="sa_swa", att=None, **kw):
    return ModelConfig(**{**SMALL, **kw}, attention=AttentionSpec(variant, **{**ATT, **(att or {})}))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_360m_parameter_counts_match_the_paper(variant):
    with torch.device("meta"):
        model = Transformer(ModelConfig.from_name("360m", variant=variant))
    # per layer: qkv 3d^2 + out d^2 + output gate d^2 + SwiGLU 3*d*d_ff + two RMSNorms 2d = 13,643,776;
    # 24 layers + the final norm (d) + the tied embedding (32000 * d) = 360,219,648 ("360M" in the paper)
    per_layer = 3 * 1024**2 + 1024**2 + 1024**2 + 3 * 1024 * 2734 + 2 * 1024
    single = 24 * per_layer + 1024 + 32000 * 1024
    assert single == 360_219_648
    # sa_swa has one more d x d gate per layer (Eq. 6-7): + 24 * 1024^2 = 385,385,472
    extra_gates = len(get_variant(variant).paths) - 1  # a gated pair's second path
    assert model.num_parameters() == single + extra_gates * 24 * 1024**2
    assert model.cfg.d_ff == 2734
    assert model.lm_head.weight is model.embed.weight


def test_fused_qkv_has_no_bias_and_gqa_shrinks_it():
    model = Transformer(_cfg(n_kv_head=2))
    attn = model.blocks[0].attn
    assert attn.qkv.bias is None and attn.qkv.weight.shape == (32 + 2 * 16, 32)


def _logits(variant, idx, **kw):
    torch.manual_seed(0)
    model = Transformer(_cfg(variant, att=kw)).double()
    return model(idx, perm_stream=0)


def test_sa_with_a_window_beyond_the_sequence_equals_full_attention():
    # if RoPE used permuted positions, the SA logits would differ from full attention's
    idx = torch.randint(0, 97, (2, 40))
    full = _logits("full", idx)
    torch.testing.assert_close(_logits("sa", idx, window=128), full)
    torch.testing.assert_close(_logits("swa", idx, window=128), full)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_variant_is_causal_in_original_positions(variant):
    torch.manual_seed(0)
    model = Transformer(_cfg(variant)).double()
    idx = torch.randint(0, 97, (1, 48))
    changed = idx.clone()
    changed[0, 30:] = (changed[0, 30:] + 1) % 97
    a, b = model(idx, perm_stream=3), model(changed, perm_stream=3)
    torch.testing.assert_close(a[:, :30], b[:, :30])
    assert not torch.allclose(a[:, 30:], b[:, 30:])


def test_permutations_are_seeded_per_step_and_fixed_mode_keeps_them():
    model = Transformer(_cfg("sa", seed=7))
    first, again, other = model.draws(48, 5, "cpu"), model.draws(48, 5, "cpu"), model.draws(48, 6, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    assert not torch.equal(first[0], first[1])  # one independent permutation per layer
    assert not torch.equal(first[0], Transformer(_cfg("sa", seed=8)).draws(48, 5, "cpu")[0])
    fixed = Transformer(_cfg("sa", seed=7, permutation="deterministic"))
    assert Transformer(_cfg("sa", seed=7, permutation="fixed")).cfg.permutation == "deterministic"  # the old name
    assert torch.equal(fixed.draws(48, 5, "cpu")[0], fixed.draws(48, 6, "cpu")[0])
    assert Transformer(_cfg("swa")).draws(48, 5, "cpu") == [None, None]


def test_single_path_checkpoints_load_across_variants():
    full = Transformer(_cfg("full")).state_dict()
    Transformer(_cfg("sa")).load_state_dict(full)
    assert {"blocks.0.attn.gate.gates.sa.weight", "blocks.0.attn.gate.gates.swa.weight"} <= set(
        Transformer(_cfg("sa_swa")).state_dict())


@pytest.mark.parametrize("bad, message", [
    (dict(attention=dict(variant="sax")), "unknown attention variant 'sax'"),
    (dict(n_head=3), "divisible by n_head=3"),
    (dict(attention=dict(window=0)), "window"),
    (dict(backbone="qwen3"), "backbone qwen3 has no output gate, so the gated sa_swa cannot run on it"),
    (dict(permutation="random"), "permutation must be one of"),
    (dict(n_kv_head=3), "divisible by n_kv_head=3"),
    (dict(token_shift=True, backbone="qwen3", attention=dict(variant="sa")), "a Hugging Face qwen3 has none"),
])
def test_bad_model_config_fails_in_one_sentence(bad, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**SMALL, **bad})


def test_sequences_longer_than_max_seq_len_are_refused():
    model = Transformer(_cfg())
    with pytest.raises(ValueError, match="max_seq_len=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize("variant", ["swa", "sa", "sa_swa", "moba"])
def test_model_never_materializes_an_n_by_n_attention_matrix(variant):
    from tests.helpers import LargestTensor

    # head dim 8 keeps MoBA's gathered (n, c, d) keys, which are O(n*c*d), apart from n*n
    n = 4096
    model = Transformer(_cfg(variant, att=dict(window=32, block_size=32), max_seq_len=n, n_head=4))
    idx = torch.randint(0, 97, (1, n))
    with LargestTensor() as probe:
        model(idx, perm_stream=0).sum().backward()
    dense_scores = 4 * n * n  # B x H x n x n, what full attention's score matrix would hold
    assert probe.largest < dense_scores // 8, f"{variant} made a tensor of {probe.largest} elements"


def test_token_shift_adds_a_learnt_map_of_each_tokens_predecessor_and_stays_causal():
    """token_shift: the first block reads embed(x_t) + W embed(x_{t-1}) (zero before the first token); the paper's
    model (off) has no such weight, so its checkpoints load as before; a later token never reaches an earlier one;
    decoding against a KV cache, which keeps no predecessor, is refused."""
    torch.manual_seed(0)
    model = Transformer(_cfg("sa", token_shift=True)).double()
    idx = torch.randint(0, 97, (2, 40))
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[0]))
    model(idx, perm_stream=0)
    e = model.embed(idx)
    before = torch.cat([torch.zeros_like(e[:, :1]), e[:, :-1]], dim=1)
    torch.testing.assert_close(seen["x"], e + before @ model.shift.weight.T)
    changed = idx.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 97
    a, b = model(idx, perm_stream=3), model(changed, perm_stream=3)
    torch.testing.assert_close(a[:, :20], b[:, :20])
    assert "shift.weight" in model.state_dict() and "shift.weight" not in Transformer(_cfg("sa")).state_dict()
    with pytest.raises(ValueError, match="decoding against a cache is not supported"):
        model.features(idx, decode=())
