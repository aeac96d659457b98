"""The training stack end to end through the CLI: every variant, resume, 2-process DDP, bad input."""
import json
import os
from pathlib import Path

import pytest
import torch

from sa_lightning.attention import VARIANTS
from sa_lightning.lit.cli import run
from tests.helpers import run_cli_here

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/fast.yaml")]


def _callbacks(*specs) -> list[str]:
    return ["--trainer.callbacks", json.dumps([{"class_path": c, "init_args": a} for c, a in specs])]


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_dev_run_trains_every_variant(variant, tmp_path):
    cli = run(["fit", *BASE, "--model", str(ROOT / f"configs/model/{variant}.yaml"),
               "--trainer.fast_dev_run", "true", "--trainer.default_root_dir", str(tmp_path)])
    metrics = cli.trainer.callback_metrics
    assert cli.model.arch.attention.variant == variant and cli.model.arch.vocab_size == 4096  # linked from the tokenizer
    assert torch.isfinite(metrics["train/loss"]) and torch.isfinite(metrics["val/ppl"])
    assert metrics["val/ppl"] == pytest.approx(torch.exp(metrics["val/loss"]).item(), rel=1e-5)


def _record(tmp_path, name, extra):
    out = tmp_path / name
    run(["fit", *BASE, "--trainer.default_root_dir", str(tmp_path / f"root_{name}"), *extra(out)])
    return json.loads((out / "rank0.json").read_text())


@pytest.mark.slow
def test_resume_continues_with_the_next_unseen_batch_and_the_same_losses(tmp_path):
    full = _record(tmp_path, "full", lambda out: _callbacks(("tests.helpers.RecordBatches", {"out": str(out)})))
    ck = tmp_path / "ck"
    first = _record(tmp_path, "first", lambda out: _callbacks(
        ("lightning.pytorch.callbacks.ModelCheckpoint", {"dirpath": str(ck), "every_n_train_steps": 3, "save_top_k": -1}),
        ("tests.helpers.RecordBatches", {"out": str(out)}),
        ("tests.helpers.StopAfter", {"steps": 3}),
    ))
    (ckpt,) = ck.glob("*.ckpt")
    rest = _record(tmp_path, "rest", lambda out: [
        *_callbacks(("tests.helpers.RecordBatches", {"out": str(out)})), "--ckpt_path", str(ckpt)])
    assert [s["rows"] for s in first] == [s["rows"] for s in full[:3]]
    assert [s["rows"] for s in rest] == [s["rows"] for s in full[3:]]
    assert [s["loss"] for s in rest] == pytest.approx([s["loss"] for s in full[3:]], rel=1e-6, abs=1e-6)


@pytest.mark.slow
def test_resume_with_another_tokenizer_is_refused(tmp_path):
    from sa_lightning.data import embedded_documents
    from sa_lightning.data.tokenizer import train_embedded_tokenizer

    ck = tmp_path / "ck"
    run(["fit", *BASE, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path),
         *_callbacks(("lightning.pytorch.callbacks.ModelCheckpoint", {"dirpath": str(ck), "every_n_train_steps": 2}))])
    small = tmp_path / "small_tokenizer.json"
    train_embedded_tokenizer(list(embedded_documents("validation"))[:5], vocab_size=300).save(str(small))
    with pytest.raises(ValueError, match="vocab"):
        run(["fit", *BASE, "--data.tokenizer", str(small), "--trainer.max_steps", "4",
             "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", str(next(ck.glob("*.ckpt")))])


@pytest.mark.parametrize("args, message", [
    (["--model.arch.attention.variant", "sax"], f"error: unknown attention variant 'sax'; choose one of "
                                                     f"{', '.join(VARIANTS)}. Did you mean"),
    (["--model.arch.n_head", "3"], "error: model d_model=128 must be divisible by n_head=3."),
    (["--model.arch.attention.window", "0"], "error: window must be"),
    (["--data.train", '{"kind": "files", "paths": ["/no/such/dir/*.txt"]}'], "error: data path '/no/such/dir/*.txt' matches no file."),
    (["--data.train", '{"kind": "hub", "path": "DKYoon/SlimPajama-6B"}'], "needs the network"),
])
def test_bad_input_fails_in_one_line_before_training(args, message, tmp_path):
    proc = run_cli_here("fit", *BASE, "--trainer.default_root_dir", str(tmp_path), *args)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert message in last, proc.stderr[-2000:]
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow
def test_window_longer_than_the_sequence_trains_as_full_attention(tmp_path):
    cli = run(["fit", *BASE, "--model.arch.attention.variant", "sa", "--model.arch.attention.window", "1000",
               "--trainer.fast_dev_run", "true", "--trainer.default_root_dir", str(tmp_path)])
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_paper_recipe_arithmetic():
    from sa_lightning.lit.schedule import steps_for_tokens, warmup_cosine

    per_step = 16 * 2048 * 30 * 4  # per-GPU batch x seq x accumulation x GPUs = 3.93M tokens
    assert steps_for_tokens(15_000_000_000, per_step) == 3815
    assert steps_for_tokens(500_000_000, per_step) == 128
    f = warmup_cosine(128, 3815, 0.1)
    assert f(0) == pytest.approx(1 / 128) and f(127) == 1.0 and f(3815) == pytest.approx(0.1)
    assert f(128 + (3815 - 128) // 2) == pytest.approx(0.55, abs=1e-3)


@pytest.mark.slow
def test_paper_config_runs_its_hub_code_path_with_local_stand_ins(tmp_path):
    """configs/pretrain_360m.yaml, with the Mistral tokenizer and SlimPajama replaced by local copies."""
    from sa_lightning.data import embedded_documents, load_tokenizer

    tok_dir, hub_dir = tmp_path / "mistral_stand_in", tmp_path / "slimpajama_stand_in"
    load_tokenizer("embedded").save_pretrained(tok_dir)
    (hub_dir / "data").mkdir(parents=True)
    for split in ("train", "validation"):
        docs = list(embedded_documents(split))[:40]
        (hub_dir / "data" / f"{split}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    env_before = dict(os.environ)
    try:
        cli = run(["fit", "--config", str(ROOT / "configs/pretrain_360m.yaml"),
                   "--trainer", str(ROOT / "configs/trainer/cpu.yaml"), "--trainer.fast_dev_run", "true",
                   "--trainer.logger", "false", "--trainer.callbacks", "[]", "--trainer.default_root_dir", str(tmp_path),
                   "--data.tokenizer", str(tok_dir), "--data.train.path", str(hub_dir), "--data.val.path", str(hub_dir),
                   "--data.seq_len", "128", "--data.batch_size", "2", "--data.num_workers", "0", "--data.progress", "false",
                   "--model.arch.n_layer", "2", "--model.arch.d_model", "64", "--model.arch.n_head", "4",
                   "--model.arch.max_seq_len", "128", "--model.arch.attention.window", "32"])
    finally:  # the paper's DDP strategy, run in this process, leaves its process group and LOCAL_RANK, MASTER_PORT, ...
        # in os.environ; a later test here would trip on the group, and a DDP run it starts would take LOCAL_RANK
        # for "already launched" and wait forever for its second rank (seen with pytest -n 2)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(env_before)
    assert cli.datamodule.train_source.describe() == f"hub:{hub_dir}:train"
    assert cli.trainer.accumulate_grad_batches == 30 and cli.model.hparams.max_tokens == 15_000_000_000
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


@pytest.mark.slow
def test_max_tokens_sets_max_steps(tmp_path):
    per_step = 4 * 64  # fast.yaml: batch 4 x seq 64, one process, no accumulation
    cli = run(["fit", *BASE, "--model.max_tokens", str(3 * per_step - 5), "--trainer.max_steps", "-1",
               "--trainer.default_root_dir", str(tmp_path)])
    assert cli.trainer.global_step == 3 and cli.model.tokens_seen == 3 * per_step


@pytest.mark.slow
def test_last_checkpoint_is_written_at_max_steps_and_loads_weights_only(tmp_path):
    from sa_lightning.lit import LitLM

    run(["fit", *BASE, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path), *_callbacks(
        ("lightning.pytorch.callbacks.ModelCheckpoint", {"dirpath": str(tmp_path / "ck"), "every_n_train_steps": 100}),
        ("sa_lightning.lit.CheckpointAtEnd", {}))])
    ckpt = torch.load(tmp_path / "ck" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2 and ckpt["LMDataModule"]["consumed_blocks"] == 2 * 4
    model = LitLM.load_from_checkpoint(tmp_path / "ck" / "last.ckpt", weights_only=True)
    assert model.arch.attention.variant == "sa_swa" and model.arch.vocab_size == 4096


@pytest.mark.slow
def test_config_is_saved_and_a_requeued_run_into_the_same_folder_does_not_fail(tmp_path):
    for steps in ("1", "2"):  # the second run finds config.yaml from the first, as a requeued job does
        run(["fit", *BASE, "--trainer.max_steps", steps, "--trainer.default_root_dir", str(tmp_path)])
    assert "max_steps: 2" in (tmp_path / "config.yaml").read_text()


@pytest.mark.slow
def test_qwen3_backbone_trains_through_the_registry_and_exports_a_plain_hf_model(tmp_path):
    """backbone: qwen3 trains every variant via the patcher; ExportHF writes a folder plain transformers loads."""
    from transformers import AutoModelForCausalLM

    for variant in ("sa", "full"):
        out = tmp_path / variant
        cli = run(["fit", "--config", str(ROOT / "configs/tiny_qwen3.yaml"), "--config",
                   str(ROOT / "tests/configs/fast.yaml"), "--model.arch.attention.variant", variant,
                   "--trainer.max_steps", "3", "--trainer.default_root_dir", str(out), *_callbacks(
                       ("sa_lightning.lit.ExportHF", {"dirpath": str(out / "hf")}))])
        assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
        assert cli.model.net.hf.config._attn_implementation == "sa_lightning"
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "full" / "hf").eval()
    assert plain.config._attn_implementation != "sa_lightning"
    idx = torch.randint(0, 4096, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(plain(idx).logits, cli.model.net.eval()(idx), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_continued_pretraining_starts_from_an_exported_model_and_checks_its_sizes(tmp_path):
    from transformers import AutoModelForCausalLM

    base = ["fit", "--config", str(ROOT / "configs/tiny_qwen3.yaml"), "--config", str(ROOT / "tests/configs/fast.yaml"),
            "--trainer.max_steps", "2"]
    run([*base, "--trainer.default_root_dir", str(tmp_path / "a"),
         *_callbacks(("sa_lightning.lit.ExportHF", {"dirpath": str(tmp_path / "hf")}))])
    start = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    cli = run([*base, "--model.arch.attention.variant", "sa", "--model.arch.init_from", str(tmp_path / "hf"),
               "--trainer.max_steps", "0", "--trainer.default_root_dir", str(tmp_path / "b")])
    loaded = cli.model.net.hf.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in start.items())
    with pytest.raises(ValueError, match="does not match model.arch: num_hidden_layers=4 \\(config: 2\\)"):
        run([*base, "--model.arch.n_layer", "2", "--model.arch.init_from", str(tmp_path / "hf"),
             "--trainer.default_root_dir", str(tmp_path / "c")])


def test_fsdp_config_parses_and_asks_for_gpus_on_a_cpu(tmp_path):
    proc = run_cli_here("fit", *BASE, "--trainer", str(ROOT / "configs/trainer/fsdp_4gpu.yaml"), "--trainer.accelerator",
                        "cpu", "--trainer.devices", "1", "--trainer.default_root_dir", str(tmp_path))
    assert proc.returncode != 0
    assert "error: The strategy `fsdp` requires a GPU accelerator" in proc.stderr.strip().splitlines()[-1]
    # the strategy itself builds on a CPU: blocks of both backbones are the FSDP wrap units
    import yaml
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import FSDPStrategy

    from sa_lightning.models.transformer import Block

    spec = yaml.safe_load((ROOT / "configs/trainer/fsdp_4gpu.yaml").read_text())["strategy"]
    parser = ArgumentParser()
    parser.add_class_arguments(FSDPStrategy, "strategy")
    strategy = parser.instantiate(parser.parse_object({"strategy": spec["init_args"]})).strategy
    assert Block in strategy.kwargs["auto_wrap_policy"]._module_classes


@pytest.mark.slow
@pytest.mark.gpu
def test_fsdp_trains_on_gpus(tmp_path):
    cli = run(["fit", *BASE, "--trainer", str(ROOT / "configs/trainer/fsdp_4gpu.yaml"), "--trainer.devices", "1",
               "--trainer.max_steps", "2", "--trainer.accumulate_grad_batches", "2", "--trainer.logger", "false",
               "--trainer.callbacks", "[]", "--trainer.default_root_dir", str(tmp_path)])
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


@pytest.mark.slow
def test_bf16_mixed_precision_and_gradient_accumulation_on_cpu(tmp_path):
    cli = run(["fit", *BASE, "--trainer.precision", "bf16-mixed", "--trainer.accumulate_grad_batches", "2",
               "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path)])
    assert cli.trainer.global_step == 2 and cli.model.micro_step == 4  # two micro-batches per optimizer step
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


def test_every_n_steps_callbacks_act_once_per_step_under_gradient_accumulation():
    from types import SimpleNamespace

    from sa_lightning.lit.callbacks import EveryNSteps

    cb, trainer = EveryNSteps(2), SimpleNamespace(global_step=0)
    fired = []
    for step in (0, 0, 1, 1, 2, 2, 3, 3, 4, 4):  # on_train_batch_end runs per micro-batch: 2 per step
        trainer.global_step = step
        fired.append(cb.due(trainer))
    assert [s for s, f in zip((0, 0, 1, 1, 2, 2, 3, 3, 4, 4), fired) if f] == [2, 4]
    with pytest.raises(ValueError, match="every_n_steps must be >= 0"):
        EveryNSteps(-1)


def test_fsdp_clips_by_the_norm_across_shards_where_lightning_refuses(monkeypatch):
    """Lightning's FSDPPrecision raises on ``gradient_clip_val`` (the shipped fsdp_4gpu.yaml sets 1.0): the module
    clips with FSDP's own ``clip_grad_norm_`` and logs its norm. FSDP1 runs on CPU over gloo, world size 1."""
    import socket
    from types import SimpleNamespace

    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    from sa_lightning.lit import LitLM
    from sa_lightning.models import ModelConfig

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        lit = LitLM(arch=ModelConfig.from_name("debug"))
        root = FullyShardedDataParallel(lit, sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=True,
                                        device_id=torch.device("cpu"))
        monkeypatch.setattr(type(lit), "trainer", property(lambda self: SimpleNamespace(model=root)))
        logged = {}
        monkeypatch.setattr(lit, "log", lambda name, value, **kw: logged.update({name: float(value)}))
        idx = torch.randint(0, lit.net.cfg.vocab_size, (2, 16))
        (lit.net(idx).float().pow(2).mean() * 1e4).backward()
        before = torch.nn.utils.get_total_norm([p.grad for p in lit.parameters() if p.grad is not None])
        lit.configure_gradient_clipping(None, gradient_clip_val=0.5, gradient_clip_algorithm=None)
        after = torch.nn.utils.get_total_norm([p.grad for p in lit.parameters() if p.grad is not None])
        assert logged["train/grad_norm"] == pytest.approx(float(before), rel=1e-4) and float(before) > 0.5
        assert float(after) == pytest.approx(0.5, rel=1e-3)
        lit.on_before_optimizer_step(None)  # the per-rank norm is not logged over FSDP's
        assert list(logged) == ["train/grad_norm"] and logged["train/grad_norm"] == pytest.approx(float(before), rel=1e-4)
    finally:
        dist.destroy_process_group()
