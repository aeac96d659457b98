"""``models.checkpoint``, the one reader: today's layout, the flat layout of checkpoints written before
``ModelConfig.attention``, one prefix rule and one architecture check (the resume and evaluation paths alike)."""
from dataclasses import replace

import pytest
import torch

from sa_lightning.attention import AttentionSpec
from sa_lightning.lit import LitLM
from sa_lightning.models import ModelConfig
from sa_lightning.models.checkpoint import (check_architecture, load_checkpoint, load_weights, network_weights,
                                            read_checkpoint)
from sa_lightning.models.config import upgrade_arch

CFG = ModelConfig.from_name("debug", attention=AttentionSpec("sa", window=8, block_size=8))


def _flat(arch: dict) -> dict:
    """The ``arch`` layout checkpoints had before ``ModelConfig.attention``."""
    flat = {k: v for k, v in arch.items() if k != "attention"}
    att = arch["attention"]
    flat.update(variant=att["variant"], window=att["window"], moba_block_size=att["block_size"],
                moba_top_k=att["top_k"], backend=att["backend"])
    return flat


def _save(path, lit: LitLM, arch: dict):
    import lightning

    torch.save({"state_dict": lit.state_dict(), "global_step": 5, "hyper_parameters": {"arch": arch},
                "pytorch-lightning_version": lightning.__version__,
                "sa_lightning": {"arch": arch}, "LMDataModule": {"tokenizer": "embedded"}}, path)


def test_a_checkpoint_from_before_the_attention_spec_reads_in_todays_layout(tmp_path):
    lit = LitLM(arch=CFG)
    path = tmp_path / "old.ckpt"
    _save(path, lit, _flat(CFG.to_dict()))
    ckpt = read_checkpoint(path)
    for arch in (ckpt["hyper_parameters"]["arch"], ckpt["sa_lightning"]["arch"]):
        assert "variant" not in arch and arch["attention"]["block_size"] == 8 and ModelConfig(**arch) == CFG
    model, info = load_checkpoint(path)
    assert model.cfg == CFG and info["arch"]["attention"]["variant"] == "sa" and info["step"] == 5
    assert all(torch.equal(model.state_dict()[k], v) for k, v in network_weights(ckpt).items())
    assert set(network_weights(ckpt)) == set(lit.net.state_dict())  # "net." stripped, nothing else
    again = LitLM.load_from_checkpoint(path, weights_only=True)  # Lightning's own reader: hparams upgraded too
    assert again.arch == CFG


def test_the_one_architecture_check_refuses_in_one_sentence(tmp_path):
    saved = CFG.to_dict()
    check_architecture(saved, CFG)
    check_architecture(upgrade_arch(_flat(saved)), CFG)
    other = replace(CFG, attention=replace(CFG.attention, variant="swa"))
    with pytest.raises(ValueError, match=r"^the checkpoint has model arch.attention.variant='sa' but this run "
                                         r"configures 'swa'; resume with the checkpoint's model"):
        check_architecture(saved, other)
    lit = LitLM(arch=replace(CFG, n_layer=3))
    with pytest.raises(ValueError, match="arch.n_layer=2 but this run configures 3"):
        lit.on_load_checkpoint({"sa_lightning": {"arch": _flat(saved)}})  # a flat (old) checkpoint is checked too
    path = tmp_path / "a.ckpt"
    _save(path, LitLM(arch=CFG), saved)
    with pytest.raises(ValueError, match="does not fit this model"):
        load_weights(LitLM(arch=replace(CFG, d_model=64)).net, path)
