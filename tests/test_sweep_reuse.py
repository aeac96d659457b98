"""A sweep reuses a finished cell only when what made it matches (issue 33): run into an older sweep's folder with
another model or limit, it says what differs in one sentence instead of reporting the old scores as its own."""
import json

import pytest
import torch


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """Two tiny random Qwen3 folders with the embedded tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sa_lightning.data.tokenizer import load_tokenizer

    tok = load_tokenizer("embedded")
    folders = []
    for seed in (0, 1):
        folder = tmp_path_factory.mktemp(f"qwen3_{seed}")
        torch.manual_seed(seed)
        sizes = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, max_position_embeddings=512)
        Qwen3ForCausalLM(Qwen3Config(**sizes, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                     pad_token_id=tok.eos_token_id)).save_pretrained(folder)
        tok.save_pretrained(folder)
        folders.append(folder)
    return folders


def test_a_cell_of_another_model_or_limit_is_refused_not_reused(two_models, tmp_path, capsys):
    from sa_lightning.inference.sweep import main

    def args(model, limit):
        return ["--model", str(model), "--dtype", "float32", "--tasks", "[shakespeare_lastword]", "--modes", "[full]",
                "--limit", str(limit), "--out", str(tmp_path)]

    main(args(two_models[0], 2))
    cell = tmp_path / "cells" / "full_wall_s0_shakespeare_lastword.json"
    assert json.loads(cell.read_text())["made_by"]["limit"] == 2.0
    capsys.readouterr()
    main(args(two_models[0], 2))
    assert "1 cells, 1 already done, 0 to run" in capsys.readouterr().out
    for other, differs in ((args(two_models[1], 2), f"model {str(two_models[0])!r} (now {str(two_models[1])!r})"),
                           (args(two_models[0], 3), "limit 2.0 (now 3.0)")):
        with pytest.raises(ValueError, match="was made with other settings: " + differs.replace("(", r"\(")
                           .replace(")", r"\)")):
            main(other)
    assert json.loads(cell.read_text())["made_by"]["limit"] == 2.0  # the old cell is untouched
