"""The benchmarks `cli.py doctor` runs on a GPU, at toy sizes on the CPU: compiled training with MFU and peak
memory (bench train), and prefill on a random model of Qwen3-8B's shapes (bench prefill)."""
from __future__ import annotations

import functools
import math

import pytest
import torch

from sa_lightning.bench import prefill as P
from sa_lightning.bench import train as T

TOY = ["--steps", "1", "--repeats", "1", "--seq-len", "64", "--batch", "2", "--no-data"]


@pytest.mark.slow
def test_compile_both_on_the_cpu_times_eager_and_lists_compiled_rows_as_skipped(tmp_path):
    rows, _ = T.main([*TOY, "--variants", "swa", "sa", "--compile", "both", "--out", str(tmp_path)])
    assert [(r["variant"], r["compile"]) for r in rows] == [("swa", False), ("swa", True), ("sa", False), ("sa", True)]
    eager = [r for r in rows if not r["compile"]]
    assert all(r["tokens_per_s"] > 0 and r["peak_mib"] > 0 and not r["note"] for r in eager)
    assert all(math.isnan(r["mfu"]) for r in eager)  # a CPU has no peak FLOP/s in Lightning's table
    compiled = [r for r in rows if r["compile"]]
    assert all(math.isnan(r["tokens_per_s"]) and r["note"] == T.CPU_COMPILE_NOTE for r in compiled)
    text = (tmp_path / "train_cpu.md").read_text()
    assert "| variant | compile | params (M) | step (ms) | tokens/s | × SWA | MFU | peak MiB |" in text
    assert "| sa | True | – | – | – | – | – | – |" in text and T.CPU_COMPILE_NOTE in text


def test_compile_on_refuses_the_cpu_in_one_sentence(tmp_path):
    with pytest.raises(SystemExit, match=r"^error: --compile on times compiled training on CUDA only; .*\.$"):
        T.main([*TOY, "--compile", "on", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_mfu_is_tokens_per_second_times_train_flops_per_token_over_the_peak(tmp_path, monkeypatch):
    """With a known peak (the device's peak, patched: a CPU has none) and the compiled path forced onto the CPU
    (dynamo with the eager backend: the plumbing, not Inductor), each row's MFU is exactly tokens/s x
    flops/token / peak, and the warm-up steps are never timed."""
    from sa_lightning.models import ModelConfig, Transformer
    from sa_lightning.models.flops import matmul_params, train_flops_per_token

    peak = 3.5e12
    assert T.peak_flops("cpu", torch.float32) is None
    monkeypatch.setattr(T, "peak_flops", lambda device, dtype: peak)
    monkeypatch.setattr(T, "COMPILED_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    calls = []
    timed = T.StepCase.timed
    monkeypatch.setattr(T.StepCase, "timed", lambda self, steps: calls.append(steps) or timed(self, steps))
    rows, data = T.main([*TOY, "--variants", "swa", "full", "--compile", "both", "--warmup", "3",
                         "--out", str(tmp_path)])
    assert calls == [3] * 4 + [1] * 4  # 4 cases warmed up (3 steps each), then timed (1 step each)
    assert data["peak_flops"] == peak
    for r in rows:
        cfg = ModelConfig.from_name("tiny", variant=r["variant"], window=32, max_seq_len=64, block_size=16)
        flops = train_flops_per_token(cfg, 64, matmul_params(Transformer(cfg)))
        assert r["flops_per_token"] == flops and r["mfu"] == r["tokens_per_s"] * flops / peak
        assert r["peak_mib"] > 0 and r["vs_eager"] > 0
    assert rows[1]["compile"] and rows[1]["params_M"] == rows[0]["params_M"]  # the compiled twin shares the model
    assert f"| swa | True | {rows[1]['params_M']:.2f} |" in (tmp_path / "train_cpu.md").read_text()
    assert f"{rows[0]['mfu'] * 100:.1f}% |" in (tmp_path / "train_cpu.md").read_text()


def test_qwen3_8b_random_has_qwen3_8bs_shapes():
    model = P.meta_model(P.qwen3_8b_config(), torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == 8_190_735_360  # Qwen3-8B: 8.19B, 6.95B without embeddings
    layer = {n.split(".layers.0.")[1]: tuple(p.shape) for n, p in model.named_parameters() if ".layers.0." in n}
    assert layer == {"self_attn.q_proj.weight": (4096, 4096), "self_attn.k_proj.weight": (1024, 4096),
                     "self_attn.v_proj.weight": (1024, 4096), "self_attn.o_proj.weight": (4096, 4096),
                     "self_attn.q_norm.weight": (128,), "self_attn.k_norm.weight": (128,),
                     "mlp.gate_proj.weight": (12288, 4096), "mlp.up_proj.weight": (12288, 4096),
                     "mlp.down_proj.weight": (4096, 12288), "input_layernorm.weight": (4096,),
                     "post_attention_layernorm.weight": (4096,)}
    assert model.model.embed_tokens.weight.shape == model.lm_head.weight.shape == (151936, 4096)
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # untied
    assert len(model.model.layers) == 36 and {p.dtype for p in model.parameters()} == {torch.bfloat16}
    short = P.meta_model(P.qwen3_8b_config(layers=1), torch.bfloat16)
    assert sum(p.numel() for p in short.parameters()) == 8_190_735_360 - 35 * 192_946_432
    c = model.config
    assert (c.rope_theta if hasattr(c, "rope_theta") else c.rope_parameters["rope_theta"]) == 1_000_000
    assert (c.max_position_embeddings, c.rms_norm_eps, c.tie_word_embeddings) == (40960, 1e-6, False)


def test_bench_prefill_runs_a_random_qwen3_8b_shrunk_to_the_cpu(tmp_path, monkeypatch):
    """The 8B model's build path (meta, allocate in the dtype, initialise, rebuild RoPE's buffers) at a width
    a test can afford; one layer at the real width takes 10-20 s on a 2-core CPU (see the module docstring)."""
    from transformers import Qwen3ForCausalLM

    for key, value in dict(vocab_size=512, hidden_size=256, intermediate_size=768, num_attention_heads=4,
                           num_key_value_heads=1, head_dim=64).items():
        monkeypatch.setitem(P.QWEN3_8B, key, value)
    model = P.random_model(P.qwen3_8b_config(layers=2), torch.device("cpu"), torch.bfloat16)
    reference = Qwen3ForCausalLM(P.qwen3_8b_config(layers=2))
    for (name, buf), (_, want) in zip(model.named_buffers(), reference.named_buffers()):
        assert torch.equal(buf, want), name  # RoPE's frequencies, not what to_empty left
    weights = model.model.layers[0].mlp.up_proj.weight
    assert weights.dtype == torch.bfloat16 and abs(weights.float().std().item() - 0.02) < 0.002
    assert torch.all(model.model.norm.weight == 1)
    rows = P.main(["--model", "qwen3-8b-random", "--layers", "1", "--dtype", "bfloat16", "--lengths", "64",
                   "--window", "32", "--repeats", "1", "--out", str(tmp_path)])
    assert [r["mode"] for r in rows] == list(P.MODES)
    assert all(r["ms"] > 0 and r["peak_mib"] > 0 for r in rows)
    assert "model qwen3-8b-random (1 layers)" in (tmp_path / "prefill.md").read_text()


def test_bench_prefill_refuses_weights_that_do_not_fit_before_allocating(monkeypatch):
    monkeypatch.setattr(P, "available_bytes", lambda device: 2**30)
    with pytest.raises(ValueError, match=r"^--model qwen3-8b-random with 36 layers needs 15\.3 GiB of bfloat16 "
                                         r"weights but cpu has 1\.0 GiB free; .*\.$"):
        P.random_model(P.qwen3_8b_config(), torch.device("cpu"), torch.bfloat16)


def test_bench_prefill_layers_is_for_the_random_models_only(capsys):
    with pytest.raises(SystemExit):
        P.main(["--model", "Qwen/Qwen3-8B", "--layers", "2"])
    assert "--layers applies to the random models (tiny, qwen3-8b-random), not to 'Qwen/Qwen3-8B'." in capsys.readouterr().err


@pytest.mark.gpu
def test_paper_preset_compiles_and_reports_mfu_on_a_gpu(tmp_path):
    rows, _ = T.main(["--preset", "paper", "--layers", "2", "--batch", "2", "--steps", "2", "--repeats", "1",
                      "--variants", "swa", "sa", "--compile", "both", "--no-data", "--out", str(tmp_path)])
    assert [(r["variant"], r["compile"]) for r in rows] == [("swa", False), ("swa", True), ("sa", False), ("sa", True)]
    assert all(r["tokens_per_s"] > 0 and r["peak_mib"] > 0 and not r["note"] for r in rows)
    known = T.peak_flops(torch.device("cuda"), torch.bfloat16)
    assert all((0 < r["mfu"] < 1) if known else math.isnan(r["mfu"]) for r in rows)


@pytest.mark.gpu
def test_qwen3_8b_random_prefills_on_a_gpu(tmp_path):
    rows = P.main(["--model", "qwen3-8b-random", "--layers", "2", "--device", "cuda", "--dtype", "bfloat16",
                   "--lengths", "4096", "--repeats", "1", "--out", str(tmp_path)])
    assert [r["mode"] for r in rows] == list(P.MODES) and all(r["ms"] > 0 for r in rows)
