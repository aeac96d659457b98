"""An SA cell of a sweep scores the same however it is run: in a whole grid after other cells or alone, at any
batch size, at any thread count (issue 33: the documented SA rows must reproduce with the shipped commands)."""
import json

import pytest
import torch

SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny random Qwen3 and the embedded tokenizer, saved as a Hugging Face folder."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sa_lightning.data.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny_qwen3_repro")
    tok = load_tokenizer("embedded")
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(**SIZES, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _cells(out):
    """cell file name -> (metrics, keys per query) of every cell a sweep wrote."""
    return {p.name: (json.loads(p.read_text())["metrics"], json.loads(p.read_text())["keys_per_query"])
            for p in sorted((out / "cells").glob("*.json"))}


def test_an_sa_cell_scores_the_same_alone_in_a_grid_and_at_any_batch_size(tiny_model, tmp_path):
    from sa_lightning.experiments.sweep import main

    common = ["--model", str(tiny_model), "--dtype", "float32", "--device_map", "cpu",
              "--tasks", "[shakespeare_choice]", "--limit", "6"]
    # the whole grid: SA's cells run after full's and another window's, 4 choices of 6 items in batches of 8
    main([*common, "--modes", "[full, sa, sa_swa_union]", "--windows", "[4, 8]", "--seeds", "[1]",
          "--batch_size", "8", "--out", str(tmp_path / "grid")])
    grid = _cells(tmp_path / "grid")
    # the same SA and SA+SWA cells alone, in a fresh process state, one document per batch, on one thread
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        main([*common, "--modes", "[sa_swa_union, sa]", "--windows", "[8]", "--seeds", "[1]", "--batch_size", "1",
              "--out", str(tmp_path / "alone")])
    finally:
        torch.set_num_threads(threads)
    alone = _cells(tmp_path / "alone")
    assert set(alone) == {f"{m}_w8_s1_shakespeare_choice.json" for m in ("sa", "sa_swa_union")}
    for name, (metrics, budget) in alone.items():
        expected, expected_budget = grid[name]
        assert budget == pytest.approx(expected_budget), name
        for key, value in expected.items():
            if not key.endswith("_stderr"):
                assert metrics[key] == pytest.approx(value, abs=1e-9), (name, key)
