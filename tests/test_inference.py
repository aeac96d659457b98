"""The Hugging Face patcher on tiny random Qwen3, Qwen3-MoE and Llama models built from configs."""
import json
from pathlib import Path

import pytest
import torch

from sa_lightning.attention import variant_names
from sa_lightning.inference import patch, patched, unpatch

VARIANTS = variant_names(gated=False)  # what a pretrained model runs without training
from sa_lightning.models import patcher
from sa_lightning.models.hf_cache import CACHE, cache_of
from tests.helpers import no_cache_rename_warning

ROOT = Path(__file__).resolve().parents[1]

SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512)


def _qwen3(**kw):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**SIZES, **kw)).eval()


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**SIZES, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=32)).eval()


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SIZES)).eval()


MODELS = {"qwen3": _qwen3, "qwen3_moe": _qwen3_moe, "llama": _llama}
SETTINGS = {"full": {}, "swa": {"window": 16}, "sa": {"window": 16}, "sa_swa_union": {"window": 16},
            "moba": {"block_size": 16, "top_k": 2}, "strided": {"window": 16}, "strided_swa_union": {"window": 16},
            "random": {"window": 16}, "random_swa_union": {"window": 16}, "sa_bucket": {"window": 16},
            "sa_bucket_swa_union": {"window": 16}, "sa_fixed": {"window": 16}, "strided_local": {"window": 16},
            "strided_local_swa_union": {"window": 16}, "radix": {"window": 16}}


def _ids(batch=2, n=96, seed=0):
    return torch.randint(0, 128, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


@torch.no_grad()
def test_full_mode_equals_the_unpatched_model(model):
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, :20] = 0
    ref, ref_padded = model(ids).logits, model(ids, attention_mask=mask).logits
    with patched(model, "full"):
        torch.testing.assert_close(model(ids).logits, ref, atol=1e-5, rtol=0)
        got = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[1, 20:], ref_padded[1, 20:], atol=1e-5, rtol=0)


@torch.no_grad()
def test_sa_with_a_window_wider_than_the_sequence_is_full(model):
    ids = _ids()
    ref = model(ids).logits
    with patched(model, "sa", 1000):
        torch.testing.assert_close(model(ids).logits, ref, atol=1e-5, rtol=0)


@torch.no_grad()
def test_swa_equals_the_native_sliding_window():
    ids = _ids(n=80)
    native = _qwen3(use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert all(t == "sliding_attention" for t in native.config.layer_types)
    ref = native(ids).logits
    plain = _qwen3()
    with patched(plain, "swa", 16):
        torch.testing.assert_close(plain(ids).logits, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", list(VARIANTS))
@torch.no_grad()
def test_padded_batches_equal_solo_runs(model, mode):
    """Left- and right-padded rows give what the sequence gives alone; pads are never read."""
    lengths = (96, 57, 23)
    seqs = [_ids(1, n, seed=n)[0] for n in lengths]
    with patched(model, mode, **SETTINGS[mode]):
        solo = [model(s.view(1, -1)).logits[0] for s in seqs]
        for side in ("left", "right"):
            ids = torch.zeros(len(seqs), 96, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for b, s in enumerate(seqs):
                span = slice(96 - len(s), 96) if side == "left" else slice(0, len(s))
                ids[b, span], mask[b, span] = s, 1
            # positions as generate() gives them: each row counts from 0 at its first real token
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(ids, attention_mask=mask, position_ids=pos).logits
            for b, s in enumerate(seqs):
                span = slice(96 - len(s), 96) if side == "left" else slice(0, len(s))
                torch.testing.assert_close(logits[b, span], solo[b], atol=2e-5, rtol=0, msg=f"{side} row {b}")


@torch.no_grad()
def test_generate_works_and_decoding_is_dense(model):
    ids = _ids(2, 40)
    mask = torch.ones_like(ids)
    mask[1, :10] = 0
    with patched(model, "sa", 8):
        patcher.CALLS.clear()
        out = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        layers = model.config.num_hidden_layers
        assert patcher.CALLS["prefill"] == layers and patcher.CALLS["dense"] == 4 * layers
    assert out.shape == (2, 45)
    # the decode steps after a patched prefill equal dense decoding from the same prefill cache
    with patched(model, "sa", 8):
        first = model(ids, attention_mask=mask, use_cache=True)
    token = first.logits[:, -1].argmax(-1, keepdim=True)
    assert torch.equal(token[:, 0], out[:, 40])
    with no_cache_rename_warning():  # the cache under the installed name: Qwen3 and Llama drop the old one in 5.40
        step = model(token, attention_mask=torch.cat([mask, torch.ones_like(token)], 1),
                     **{CACHE: cache_of(first)}).logits
    assert torch.equal(step[:, -1].argmax(-1), out[:, 41])


@torch.no_grad()
def test_patched_cached_generation_equals_recomputing_without_a_cache(model):
    """Full mode through the patcher: each step of ``generate`` (KV cache, a left-padded row) gives the logits of
    the whole sequence run again without a cache, so a cache that is lost or misread fails; the tokens vary."""
    ids = _ids(2, 24)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    with patched(model, "full"), no_cache_rename_warning():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                             eos_token_id=None, output_logits=True, return_dict_in_generate=True)
        for step, logits in enumerate(out.logits):
            seq = out.sequences[:, :24 + step]
            full_mask = torch.cat([mask, torch.ones(2, step, dtype=mask.dtype)], 1)
            positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
            whole = model(seq, attention_mask=full_mask, position_ids=positions, use_cache=False).logits[:, -1]
            torch.testing.assert_close(logits, whole, atol=1e-4, rtol=0, msg=f"step {step}")
    assert all(len(set(row)) > 1 for row in out.sequences[:, 24:].tolist())


@torch.no_grad()
def test_unpatching_restores_the_model_exactly(model):
    ids = _ids()
    before = model.config._attn_implementation
    ref = model(ids).logits
    patch(model, "swa", 8)
    assert model.config._attn_implementation == "sa_lightning"
    assert not torch.allclose(model(ids).logits, ref)
    unpatch(model)
    assert model.config._attn_implementation == before
    assert torch.equal(model(ids).logits, ref)


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "stochastic", "window": 8}, "unknown attention variant 'stochastic' for a Hugging Face model"),
    ({"mode": "sa_swa", "window": 8}, "variant 'sa_swa' mixes its paths with output gates that only a model trained "
                                      "with them has; a Hugging Face model runs it training-free as 'sa_swa_union'"),
    ({"mode": "sa", "window": 0}, "window must be an integer >= 1, got 0"),
    ({"mode": "swa"}, "variant 'swa' needs a window >= 1, got None"),
    ({"mode": "moba", "block_size": 512, "top_k": 2}, "does not fit"),
    ({"mode": "moba", "block_size": 0}, "block_size"),
])
def test_bad_patch_requests_fail_in_one_sentence(kwargs, message):
    model = _qwen3()
    mode = kwargs.pop("mode")
    with pytest.raises(ValueError, match=message):
        patch(model, mode, **kwargs)
    assert model.config._attn_implementation == "sdpa"


def test_a_model_without_the_attention_interface_is_named():
    with pytest.raises(ValueError, match="Linear cannot be patched"):
        patch(torch.nn.Linear(2, 2), "sa", 8)


def test_lm_eval_model_scores_do_not_depend_on_batch_size():
    """HFLM pads loglikelihood batches with token 0 and passes no mask; PatchedHFLM passes it."""
    from lm_eval.api.instance import Instance
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sa_lightning.data.tokenizer import load_tokenizer
    from sa_lightning.inference.lm import PatchedHFLM

    tok = load_tokenizer("embedded")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{**SIZES, "vocab_size": len(tok)})).eval()
    texts = ["HAMLET:\nTo be, or not to be, that is the question:" * k for k in (1, 3, 5, 2)]
    reqs = [Instance("loglikelihood", {}, (t, " Whether"), i) for i, t in enumerate(texts)]
    scores = {}
    for batch_size in (1, 4):
        lm = PatchedHFLM(model, tokenizer=tok, variant="sa", window=8, batch_size=batch_size, device="cpu")
        scores[batch_size] = [s for s, _ in lm.loglikelihood(reqs, disable_tqdm=True)]
        unpatch(model)
    torch.testing.assert_close(torch.tensor(scores[4]), torch.tensor(scores[1]), atol=1e-4, rtol=1e-5)


@pytest.fixture(scope="module")
def local_model(tmp_path_factory):
    """A tiny random Qwen3 and the embedded tokenizer, saved as a Hugging Face folder."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sa_lightning.data.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny_qwen3")
    tok = load_tokenizer("embedded")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**{**SIZES, "vocab_size": len(tok)}, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_sweep_writes_every_cell_resumes_and_draws(local_model, tmp_path, capsys):
    from sa_lightning.experiments.sweep import main

    args = ["--model", str(local_model), "--dtype", "float32", "--tasks", "[shakespeare_lastword]",
            "--modes", "[full, swa, sa, sa_swa_union, moba]", "--windows", "[8, 32]", "--moba_block_sizes", "[4, 16]",
            "--seeds", "[0, 1]", "--limit", "3", "--out", str(tmp_path)]
    result = main(args)
    # full once, swa 2 windows, sa and sa_swa_union 2 windows x 2 seeds, moba 2 block sizes
    assert len(list((tmp_path / "cells").glob("*.json"))) == 1 + 2 + 4 + 4 + 2
    assert {(r["mode"], r["w_eff"]) for r in result["rows"]} == {
        ("full", None), *((m, w) for m in ("swa", "sa", "sa_swa_union") for w in (8, 32)), ("moba", 8), ("moba", 32)}
    table = (tmp_path / "table.md").read_text()
    assert table.splitlines()[0] == "| w_eff | Mode | keys/q | LW | Avg. |" and "| all | Full |" in table
    assert (tmp_path / "average.png").stat().st_size > 5000 and (tmp_path / "tasks.png").exists()
    assert (tmp_path / "results.csv").read_text().startswith("mode,w_eff,sink,shakespeare_lastword,avg,kpq")
    (tmp_path / "cells" / "sa_w8_s1_shakespeare_lastword.json").unlink()
    capsys.readouterr()
    main(args)
    assert "13 cells, 12 already done, 1 to run" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--modes", "[full, stochastic]"], "unknown attention variant 'stochastic'"),
    (["--windows", "[0, 8]"], "windows must all be >= 1"),
    (["--tasks", "[humaneval]"], "confirm_run_unsafe_code"),
    (["--tasks", "[hellaswg]"], "unknown task 'hellaswg'"),
])
def test_bad_sweep_configs_fail_before_any_cell(args, message, tmp_path):
    from sa_lightning.experiments.sweep import main

    with pytest.raises(ValueError, match=message):
        main(["--model", "nowhere", "--out", str(tmp_path), *args])
    assert not (tmp_path / "cells").exists() or not list((tmp_path / "cells").iterdir())


def test_sweep_names_a_model_it_cannot_load(tmp_path):
    from sa_lightning.experiments.sweep import main

    with pytest.raises(ValueError, match="model '/no/such/model' cannot be loaded"):
        main(["--model", "/no/such/model", "--tasks", "[shakespeare_lastword]", "--modes", "[full]",
              "--out", str(tmp_path)])


@pytest.mark.slow
def test_paper_sweep_configs_run_with_a_local_stand_in(local_model, tmp_path):
    """configs/sweep/qwen3_*.yaml with the hub model replaced by a local folder and the tasks by an offline one."""
    from pathlib import Path

    from sa_lightning.experiments.sweep import main

    root = Path(__file__).resolve().parents[1]
    for name in ("qwen3_8b", "qwen3_30b_a3b"):
        text = (root / "configs/sweep" / f"{name}.yaml").read_text()
        assert "windows: [16, 32, 64, 128, 256, 512]" in text and "moba_block_sizes: [32, 64, 128, 256]" in text
        out = tmp_path / name
        result = main(["--config", str(root / "configs/sweep" / f"{name}.yaml"), "--model", str(local_model),
                       "--device_map", "cpu", "--tasks", "[shakespeare_lastword]", "--windows", "[16]",
                       "--moba_block_sizes", "[8]", "--limit", "2", "--out", str(out)])
        assert {r["mode"] for r in result["rows"]} == {"full", "swa", "sa", "moba"}
        assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_moba_wider_than_the_model_fails_before_the_first_cell(local_model, tmp_path):
    from sa_lightning.experiments.sweep import main

    with pytest.raises(ValueError, match=r"block_size \* top_k = \[1024\] does not fit"):
        main(["--model", str(local_model), "--tasks", "[shakespeare_lastword]", "--modes", "[full, moba]",
              "--moba_block_sizes", "[8, 512]", "--out", str(tmp_path)])
    assert not list((tmp_path / "cells").glob("*"))  # refused before any cell file (or the folder) is written


@pytest.mark.parametrize("mode", ["swa", "sa", "sa_swa_union", "moba"])
def test_patched_prefill_never_builds_an_n_by_n_tensor(mode):
    """A padded batch at n=2048 through the patched model: no tensor near B x H x n x n, mask included."""
    from tests.helpers import LargestTensor

    from transformers import Qwen3Config, Qwen3ForCausalLM

    n = 2048
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**{**SIZES, "max_position_embeddings": n, "num_hidden_layers": 1,
                                            "head_dim": 8})).eval()
    ids = _ids(2, n)
    mask = torch.ones_like(ids)
    mask[1, :300] = 0
    settings = {"moba": {"block_size": 16, "top_k": 2}}.get(mode, {"window": 32})
    with patched(model, mode, **settings), torch.no_grad(), LargestTensor() as probe:
        model(ids, attention_mask=mask, use_cache=False)
    dense_scores = 2 * 4 * n * n
    assert probe.largest < dense_scores // 8, f"{mode} made a tensor of {probe.largest} elements"


@pytest.mark.parametrize("name", ["qwen3_8b", "qwen3_30b_a3b"])
def test_paper_sweep_configs_run_all_seven_tasks_and_opt_in_to_code_execution_in_the_file(name, tmp_path):
    from sa_lightning.experiments.sweep import EXPERIMENT, main

    config = str(ROOT / f"configs/sweep/{name}.yaml")
    cfg = EXPERIMENT.parse(["--config", config])[0]
    assert cfg.tasks == ["hellaswag", "mmlu", "arc_challenge", "boolq", "lambada_openai", "arc_easy", "humaneval_exec"]
    assert cfg.confirm_run_unsafe_code is True and "EXECUTES" in (ROOT / f"configs/sweep/{name}.yaml").read_text()
    # without the opt-in the same config refuses before it loads the model (which is not reachable here)
    with pytest.raises(ValueError, match="execute model-written code; set confirm_run_unsafe_code"):
        main(["--config", config, "--confirm_run_unsafe_code", "false", "--out", str(tmp_path)])


def _recorded_sigmas(monkeypatch):
    """Every sigma the patcher draws, per layer, as (B, n) gather indices."""
    drawn = []
    real = patcher.layer_draws

    def record(*args, **kwargs):
        perms = real(*args, **kwargs)
        drawn.extend(p.clone() for p in perms)
        return perms

    monkeypatch.setattr(patcher, "layer_draws", record)
    return drawn


def test_training_free_sa_is_stochastic_per_input_and_reproducible(monkeypatch):
    """§3.3: each input draws its own sigma from (seed, layer, its tokens); batching and padding change nothing."""
    model, drawn = _qwen3(), _recorded_sigmas(monkeypatch)
    a, b = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(1)), \
        torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(2))
    with patched(model, "sa", 8), torch.no_grad():
        model(a)
        sigma_a = [p[0] for p in drawn]
        drawn.clear()
        model(b)
        assert all(not torch.equal(pa, pb[0]) for pa, pb in zip(sigma_a, drawn))  # same length, other sigma
        drawn.clear()
        model(a)
        assert all(torch.equal(pa, p[0]) for pa, p in zip(sigma_a, drawn))  # a rerun reproduces it
        drawn.clear()
        padded = torch.cat([torch.cat([a, torch.zeros(1, 9, dtype=torch.long)], 1), torch.randint(0, 128, (1, 49))])
        mask = torch.ones(2, 49, dtype=torch.long)
        mask[0, 40:] = 0
        model(padded, attention_mask=mask)
        assert all(torch.equal(pa, p[0, :40]) for pa, p in zip(sigma_a, drawn))  # inside a padded batch: same
    with patched(model, "sa", 8, sa_mode="deterministic"), torch.no_grad():
        drawn.clear()
        model(a)
        fixed_a = [p[0] for p in drawn]
        drawn.clear()
        model(b)
        assert all(torch.equal(pa, p[0]) for pa, p in zip(fixed_a, drawn))  # one sigma per length


def test_the_draw_index_reaches_the_patcher_through_the_models_forward(monkeypatch):
    """``eval_samples``' draw s is the forward's ``sa_sample=s``: transformers hands it to the base model, whose
    pre-hook keys each row's sigma with it; 0 is the default draw."""
    tokens = torch.randint(0, 97, (2, 30), generator=torch.Generator().manual_seed(3))
    drawn = _recorded_sigmas(monkeypatch)
    runs = []
    with patched(_qwen3(), "sa", 8, seed=7) as model, torch.no_grad():
        for sample in (None, 0, 1):
            drawn.clear()
            model(tokens, **({} if sample is None else {"sa_sample": sample}))
            runs.append(list(drawn))
    default, zero, one = runs
    assert all(torch.equal(a, b) for a, b in zip(default, zero))
    assert not any(torch.equal(a[b], c[b]) for a, c in zip(zero, one) for b in range(2))


def test_the_patcher_and_salm_draw_the_same_sigma_for_the_same_tokens(monkeypatch):
    from sa_lightning.eval.lm import SALM
    from sa_lightning.attention import AttentionSpec
    from sa_lightning.models import ModelConfig, Transformer

    tokens = torch.randint(0, 97, (1, 30), generator=torch.Generator().manual_seed(3))
    drawn = _recorded_sigmas(monkeypatch)
    with patched(_qwen3(), "sa", 8, seed=7) as model, torch.no_grad():
        model(tokens)
    net = Transformer(ModelConfig(vocab_size=4096, n_layer=SIZES["num_hidden_layers"], n_head=4, d_model=32,
                                  max_seq_len=64, attention=AttentionSpec("sa", window=8)))
    salm = SALM(net, tokenizer="embedded", seed=7)
    perms = salm.model.draws([tokens[0].tolist()], 30, sample=0)
    assert len(perms) == len(drawn) and all(torch.equal(p, d) for p, d in zip(perms, drawn))
