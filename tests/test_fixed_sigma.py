"""A model trained with a fixed σ (``permutation: deterministic``, or a frozen variant such as fixed-σ SA) keeps the
draw it trained with through ``export``, ``generate`` and ``evaluate`` (issue 78): training drew from
``layer_generator(model seed, layer)``, the exported model drew from (``sa_seed``, layer, length), and the logits
differed by up to 0.8 with exit 0."""
import argparse

import pytest
import torch

import sa_lightning
from sa_lightning.attention import VARIANTS, AttentionSpec
from sa_lightning.models import ModelConfig, Transformer
from sa_lightning.models.export import export
from sa_lightning.models.hf_model import SATransformerForCausalLM

N = 24
#: every registered variant that draws, in each permutation mode whose draw is fixed by the model's seed
FIXED = [(name, mode) for name, v in VARIANTS.items() if v.draws
         for mode in (("stochastic", "deterministic") if v.frozen else ("deterministic",))]


def _net(variant: str, permutation: str) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=128, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=64, seed=7,
                      permutation=permutation,
                      attention=AttentionSpec(variant, window=6, block_size=4, top_k=2))
    net = Transformer(cfg).eval()
    with torch.no_grad():  # paths and gates that the σ moves visibly
        for name, p in net.named_parameters():
            p.add_(0.05 * torch.randn_like(p))
            if p.dim() == 2 and name != "embed.weight":
                p.mul_(4)
    return net


def _ids(rows=3, seed=1):
    return torch.randint(1, 128, (rows, N), generator=torch.Generator().manual_seed(seed))


def test_every_variant_that_draws_is_covered():
    assert {"sa", "sa_fixed", "random", "sa_swa"} <= {name for name, _ in FIXED}
    assert ("sa_fixed", "stochastic") in FIXED


@pytest.mark.parametrize("variant, permutation", FIXED)
@torch.no_grad()
def test_the_exported_model_draws_the_sigma_the_model_trained_with(variant, permutation, tmp_path):
    """The training path (eval mode: the draws of a training or validation step) against the exported folder, the
    model evaluate and generate build (any ``sa_seed``, ``sa_mode`` and draw index), whole and padded rows."""
    from transformers import AutoModelForCausalLM

    net = _net(variant, permutation)
    ids = _ids()
    trained = net(ids)  # Transformer.draws: what every training step drew
    assert torch.equal(trained, net(ids, perm_stream=5)) and torch.equal(trained, net(ids, perm_stream=-3))
    export(net, tmp_path / "hf")
    sa_lightning.register_with_transformers()
    folder = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    evaluated = SATransformerForCausalLM.from_transformer(net, sa_mode="stochastic", sa_seed=3).eval()  # eval.lm
    generating = SATransformerForCausalLM.from_transformer(net, decode="dense", sa_seed=11).eval()  # generate --ckpt
    folder_mode = SATransformerForCausalLM.from_transformer(net, sa_mode="deterministic", sa_seed=4).eval()
    for model in (folder, evaluated, generating, folder_mode):
        torch.testing.assert_close(model(ids).logits, trained, atol=1e-5, rtol=0)
        torch.testing.assert_close(model(ids, sa_sample=2).logits, trained, atol=1e-5, rtol=0)
    folder.config.sa_seed = 9  # generate --model sets the folder's sa_seed
    torch.testing.assert_close(folder(ids).logits, trained, atol=1e-5, rtol=0)
    # a padded batch: each row draws the σ a row of its own length trained with, whatever else is in the batch
    lengths = [N, 17, 9]
    mask = (torch.arange(N) < torch.tensor(lengths)[:, None]).long()
    padded = folder(ids, attention_mask=mask).logits
    for b, n in enumerate(lengths):
        torch.testing.assert_close(padded[b, :n], net(ids[b:b + 1, :n])[0], atol=1e-5, rtol=0)
    # and the σ matters: a model of another seed gives other logits
    other = _net(variant, permutation)
    other.cfg.seed = 8
    assert (other(ids) - trained).abs().max() > 1e-3


def test_a_stochastic_model_still_draws_per_input_from_the_evaluation_seed():
    net = _net("sa", "stochastic")
    ids = _ids(rows=1)
    with torch.no_grad():
        a = SATransformerForCausalLM.from_transformer(net, sa_seed=3)(ids).logits
        b = SATransformerForCausalLM.from_transformer(net, sa_seed=4)(ids).logits
    assert (a - b).abs().max() > 1e-3


@pytest.fixture(scope="module")
def fixed_checkpoint(tmp_path_factory):
    """A `cli.py fit` checkpoint of fixed-σ SA with a model seed other than any default evaluation seed."""
    from pathlib import Path

    from sa_lightning.lit.cli import run

    root, folder = Path(__file__).resolve().parents[1], tmp_path_factory.mktemp("fit")
    run(["fit", "--config", str(root / "configs/tiny.yaml"), "--config", str(root / "tests/configs/fast.yaml"),
         "--model.arch.attention.variant", "sa", "--model.arch.permutation", "deterministic",
         "--seed_everything", "7", "--trainer.max_steps", "2", "--trainer.default_root_dir", str(folder),
         "--trainer.callbacks", '[{"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": '
         f'{{"dirpath": "{folder}", "filename": "last", "every_n_train_steps": 2}}}}]'])
    return folder / "last.ckpt"


@pytest.mark.slow  # trains 2 steps
@torch.no_grad()
def test_a_fit_checkpoint_keeps_its_sigma_through_export_evaluate_and_generate(fixed_checkpoint, tmp_path):
    """The Lightning module's validation scores of a real checkpoint against `cli.py export`'s folder, evaluate's
    model (``eval.lm.SALM``) and generate's (``inference.generate.load``)."""
    from transformers import AutoModelForCausalLM

    from sa_lightning.eval.evaluate import seeds_of
    from sa_lightning.eval.lm import SALM
    from sa_lightning.inference.generate import load
    from sa_lightning.lit.module import LitLM
    from sa_lightning.models.checkpoint import load_checkpoint
    from sa_lightning.models.export import main as export_main

    lit = LitLM.load_from_checkpoint(fixed_checkpoint, map_location="cpu").eval()
    assert lit.net.cfg.permutation == "deterministic" and lit.net.cfg.seed == 7
    ids = torch.randint(1, 200, (2, 64), generator=torch.Generator().manual_seed(0))
    want = lit.eval_scores(ids, lit.val_stream(0))
    export_main(["--ckpt", str(fixed_checkpoint), "--out", str(tmp_path / "hf")])
    sa_lightning.register_with_transformers()
    folder = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    torch.testing.assert_close(folder(ids).logits, want, atol=1e-5, rtol=0)
    for seed in (0, 3):
        lm = SALM(str(fixed_checkpoint), seed=seed)
        torch.testing.assert_close(lm.model(ids).logits, want, atol=1e-5, rtol=0)
        model, _, _ = load(argparse.Namespace(ckpt=str(fixed_checkpoint), model=None, decode=None, seed=seed))
        torch.testing.assert_close(model(ids).logits, want, atol=1e-5, rtol=0)
    _, info = load_checkpoint(fixed_checkpoint)
    assert seeds_of(info, None) == [0]  # every σ seed would score it alike: scored once
