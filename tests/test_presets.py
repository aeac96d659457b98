"""The model presets are Python (an installed copy has no configs/); the shipped run configs whose model they
are must agree with them, field by field."""
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from sa_lightning.attention import AttentionSpec
from sa_lightning.data.tokenizer import EMBEDDED, EMBEDDED_VOCAB
from sa_lightning.models.config import PRESETS, ModelConfig

ROOT = Path(__file__).resolve().parents[1]
#: preset -> the shipped config whose ``model.arch`` it is
SHIPPED = {"tiny": "configs/tiny.yaml", "360m": "configs/pretrain_360m.yaml"}
#: the vocabulary of each tokenizer the shipped data configs name (the Hub ones cannot be loaded offline)
VOCAB = {EMBEDDED: EMBEDDED_VOCAB, "mistralai/Mistral-7B-v0.1": 32000}


def _data_section(config: dict, path: Path) -> dict:
    """The run config's data section; a string names a data config relative to the run config's folder."""
    data = config.get("data") or {}
    return yaml.safe_load((path.parent / data).read_text()) if isinstance(data, str) else data


def shipped_model(name: str) -> ModelConfig:
    """The model ``configs/<...>.yaml`` trains: its ``model.arch`` with the vocabulary its data links in
    (``data.vocab_size`` -> ``model.arch.vocab_size``, ``lit/cli.py``)."""
    path = ROOT / SHIPPED[name]
    config = yaml.safe_load(path.read_text())
    arch = dict(config["model"]["arch"])
    tokenizer = _data_section(config, path)["tokenizer"]
    assert "vocab_size" not in arch, f"{path.name}: the vocabulary comes from the data's tokenizer"
    return ModelConfig.from_dict({**arch, "vocab_size": VOCAB[tokenizer]})


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_yaml_agrees_with_its_python_preset_field_by_field(name):
    preset, shipped = PRESETS[name], shipped_model(name)
    for f in fields(ModelConfig):
        if f.name == "attention":
            for a in fields(AttentionSpec):
                assert getattr(shipped.attention, a.name) == getattr(preset.attention, a.name), \
                    (name, f"attention.{a.name}")
        else:
            assert getattr(shipped, f.name) == getattr(preset, f.name), (name, f.name)
    assert shipped == preset
    assert ModelConfig.from_name(name) == preset


def test_presets_need_no_checkout_and_derived_sizes_follow_the_overrides():
    """``from_name`` reads no file; d_ff and n_kv_head follow an overridden d_model and n_head, as they do
    when a YAML leaves them out."""
    small = ModelConfig.from_name("tiny", n_layer=2, n_head=2, d_model=64, window=16, block_size=8)
    assert (small.n_kv_head, small.d_ff) == (2, 170)
    assert (small.attention.window, small.attention.block_size, small.attention.top_k) == (16, 8, 2)
    assert small.attention.variant == "sa_swa" and small.vocab_size == EMBEDDED_VOCAB
    assert ModelConfig.from_name("360m").d_ff == 2734
    assert PRESETS["tiny"].d_ff == 341  # the preset itself is unchanged by from_name's overrides
