"""GPU readiness, checked on the CPU: the FLOPs behind MFU, and the GPU paths that a CPU can run today.

- MFU counts what runs: 6N + 12 L d keys, with N hand-counted for the tiny model (the tied LM head
  included) and the keys each variant's kernel computes (``models/flops.py``).
- Compiled FlexAttention: every training step draws new permutations (24 layers x steps of them); they
  must reach the one compiled kernel as data, never as a recompile.
- ``model.compile: true`` trains the shipped tiny config.
- FSDP: what Lightning allows without a GPU, and the shipped strategy exercised as far as a CPU goes.

bf16-mixed on the CPU is ``test_training.py::test_bf16_mixed_precision_and_gradient_accumulation_on_cpu``,
and Lightning's refusal of FSDP on a CPU is ``test_training.py::test_fsdp_config_parses_and_asks_for_gpus_on_a_cpu``.
"""
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sa_lightning.attention import get_variant, variant_names
from sa_lightning.lit.cli import run
from sa_lightning.lit import LitLM, TokenThroughput
from sa_lightning.models.flops import matmul_params

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs/tiny.yaml"


# ---- A. MFU counts what runs ---------------------------------------------------------------------
#
# The tiny model (configs/tiny.yaml): L = 4 blocks, d = 128, d_ff = floor(2.67 * 128) = 341, vocab 4096
# (the embedded tokenizer), n = 256, w = 32, MoBA 16 x 2. Its parameters, from models/transformer.py:
#   per block: attn_norm 128 + qkv 128 * 384 = 49152 + one d x d output gate per path 16384
#              + proj 16384 + mlp_norm 128 + SwiGLU gate, up, down 3 * 128 * 341 = 130944
#              = 213120 with one path, 229504 with two (sa_swa)
#   final norm 128; LM head 4096 * 128 = 524288 (tied to the embedding: one tensor, a lookup at the input
#   and a matmul at the output, so it counts once in N).
N_ONE_PATH = 4 * 213120 + 128 + 524288  # = 1376896
N_TWO_PATHS = 4 * 229504 + 128 + 524288  # = 1442432
ATTN = 12 * 4 * 128  # 12 L d = 6144 FLOPs per key per token
# flops/token = 6 N + 6144 * keys, keys: full n/2 = 128; swa, sa: w = 32; moba 16 * 2 = 32; sa_swa(_union): 2w = 64
FLOPS_PER_TOKEN = {
    "full": 6 * 1376896 + 6144 * 128,  # 8261376 + 786432 = 9047808
    "swa": 6 * 1376896 + 6144 * 32,  # 8261376 + 196608 = 8457984
    "sa": 6 * 1376896 + 6144 * 32,  # 8457984
    "moba": 6 * 1376896 + 6144 * 32,  # 8457984
    "sa_swa": 6 * 1442432 + 6144 * 64,  # 8654592 + 393216 = 9047808
    "sa_swa_union": 6 * 1376896 + 6144 * 64,  # 8261376 + 393216 = 8654592 (one softmax, no second gate)
}


def test_mfu_flops_are_hand_counted_for_the_tiny_model_and_reach_the_throughput_monitor(tmp_path):
    assert (N_ONE_PATH, N_TWO_PATHS, ATTN) == (1376896, 1442432, 6144)
    assert FLOPS_PER_TOKEN == {"full": 9047808, "swa": 8457984, "sa": 8457984, "moba": 8457984,
                               "sa_swa": 9047808, "sa_swa_union": 8654592}
    # the shipped config as users run it, stopped before its first step: setup() has set flops_per_batch
    cli = run(["fit", "--config", str(TINY), "--trainer.max_steps", "0", "--trainer.limit_val_batches", "0",
               "--trainer.default_root_dir", str(tmp_path)])
    lit = cli.model
    assert (lit.arch.attention.variant, lit.arch.vocab_size, lit.arch.d_ff, cli.datamodule.seq_len, cli.datamodule.batch_size) \
        == ("sa_swa", 4096, 341, 256, 16)
    assert lit.flops_per_batch == 9047808 * 256 * 16 == 37059821568
    assert any(isinstance(cb, TokenThroughput) for cb in cli.trainer.callbacks)  # it reads flops_per_batch
    for variant, flops in FLOPS_PER_TOKEN.items():
        other = LitLM(arch=replace(lit.arch, attention=replace(lit.arch.attention, variant=variant)))
        assert matmul_params(other.net) == (N_TWO_PATHS if variant == "sa_swa" else N_ONE_PATH), variant
        assert other.train_flops_per_token(256) == flops, variant


def test_the_6n_term_is_what_the_matmuls_measure_tied_head_included():
    """An independent count: PyTorch's FlopCounterMode over one training step of the full variant finds 6
    matmul FLOPs per weight per token, the tied LM head among them (without it: 6 * 851456). N less the
    norms' gains (2 * 4 * 128 + 128 = 1152, elementwise, in no matmul) is 1375744."""
    from torch.utils.flop_counter import FlopCounterMode

    from sa_lightning.models import ModelConfig, build_model

    model = build_model(ModelConfig.from_name("tiny", variant="full"))
    idx = torch.randint(0, 4096, (1, 256), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(idx).float().logsumexp(-1).mean().backward()
    counts = counter.get_flop_counts()["Global"]
    matmuls = sum(flops for op, flops in counts.items() if str(op) in ("aten.mm", "aten.addmm"))
    assert matmuls == 6 * (1376896 - 1152) * 256 == 2113142784


def test_windowed_variants_get_attention_credit_for_their_band_only():
    """The paper's 360M model at n = 2048, w = 256 (24 layers, d = 1024): the attention term alone
    (N = 0) is 12 * 24 * 1024 = 294912 FLOPs per key per token, times 1024 keys for causal full attention,
    256 for SWA and SA, 512 for SA+SWA and 64 * 2 = 128 for MoBA."""
    from sa_lightning.attention import AttentionSpec
    from sa_lightning.models import ModelConfig
    from sa_lightning.models.flops import train_flops_per_token

    attention = {v: train_flops_per_token(ModelConfig(attention=AttentionSpec(v)), 2048, 0)
                 for v in ("full", "swa", "sa", "sa_swa", "sa_swa_union", "moba")}
    assert attention == {"full": 301989888, "swa": 75497472, "sa": 75497472, "sa_swa": 150994944,
                         "sa_swa_union": 150994944, "moba": 37748736}
    assert attention["swa"] * 4 == attention["full"]


# ---- B1. Compiled FlexAttention: new permutations are data, not recompiles --------------------------

@pytest.mark.slow  # compiles (Inductor, with its compile workers)
def test_compiled_flex_forward_serves_every_permutation_with_one_kernel(monkeypatch):
    """A model on the flex backend (what ``auto`` picks on CUDA), forward only (FlexAttention has no CPU
    backward): 2 layers x 8 passes draw 16 distinct permutations, twice Dynamo's recompile limit of 8. They
    must all run one compiled kernel: a permutation baked into the graph would recompile per draw, and past
    the limit flex_attention runs eagerly, materializing every score (its "called without torch.compile"
    warning). Then the same with the model compiled (``model.compile: true``): 16 more draws run one graph of
    the whole block stack with FlexAttention inside it (Inductor's CPU template), with no break and no
    recompile: σ is drawn before the compiled region and passed in as data."""
    import torch.nn.attention.flex_attention as flex_module
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    from sa_lightning.attention import AttentionSpec
    from sa_lightning.models import ModelConfig, build_model

    warned = []
    monkeypatch.setattr(flex_module, "_warn_once", lambda warning_id, *args, **kwargs: warned.append(warning_id))
    cfg = ModelConfig(vocab_size=256, n_layer=2, n_head=2, d_model=32, max_seq_len=256,
                      attention=AttentionSpec("sa", window=32, backend="flex"))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    banded = build_model(replace(cfg, attention=replace(cfg.attention, backend="banded"))).eval()
    banded.load_state_dict(model.state_dict())
    idx = torch.randint(0, 256, (2, 256), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()  # count this test's compiles only

    def kernels() -> int:
        return len(_debug_get_cache_entry_list(flex_module.flex_attention.__code__))

    def passes(streams) -> set:
        drawn = set()
        with torch.no_grad():
            for stream in streams:
                drawn.update(tuple(p.tolist()) for p in model.draws(256, stream, "cpu"))
                torch.testing.assert_close(model(idx, perm_stream=stream), banded(idx, perm_stream=stream),
                                           atol=1e-4, rtol=0)
        return drawn

    graphs = counters["stats"]["unique_graphs"]
    assert len(passes(range(8))) == 16
    assert (kernels(), counters["stats"]["unique_graphs"] - graphs) == (1, 1)
    counters.clear()
    model.compile()
    assert len(passes(range(8, 16))) == 16
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"] and not counters["recompiles"], (dict(counters["graph_break"]),
                                                                        dict(counters["recompiles"]))
    assert not warned, warned


@pytest.mark.slow  # compiles (Inductor, with its compile workers)
@pytest.mark.parametrize("variant", ["swa", "sa_bucket"])
def test_a_compiled_model_on_the_cpu_gives_the_eager_models_output(variant):
    """Inductor's CPU FlexAttention template read a strided q (the head-split projection's view) wrongly inside a
    compiled model (torch 2.13: SWA's logits off by 0.14); the flex wrapper hands it contiguous tensors there.
    Bucketed SA runs its slot path (the layer's rows reordered once, SDPA over the buckets) inside the graph."""
    from sa_lightning.attention import AttentionSpec
    from sa_lightning.models import ModelConfig, build_model

    backend = "flex" if variant == "swa" else "banded"
    cfg = ModelConfig(vocab_size=256, n_layer=2, n_head=2, d_model=32, max_seq_len=256,
                      attention=AttentionSpec(variant, window=32, backend=backend))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    idx = torch.randint(0, 256, (2, 256), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = model(idx, perm_stream=3)
        model.compile()
        torch.testing.assert_close(model(idx, perm_stream=3), eager, atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["swa", "sa", "sa_bucket"])
def test_a_compiled_model_on_cuda_gives_the_eager_models_output_forward_and_backward(variant):
    """The same on CUDA, a training step's gradients included (SA and bucketed SA on their slot paths)."""
    from sa_lightning.attention import AttentionSpec
    from sa_lightning.models import ModelConfig, build_model

    cfg = ModelConfig(vocab_size=256, n_layer=2, n_head=4, d_model=256, max_seq_len=1024,
                      attention=AttentionSpec(variant, window=64))
    torch.manual_seed(0)
    model = build_model(cfg).cuda()
    idx = torch.randint(0, 256, (2, 1024), device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        out = model(idx, perm_stream=3)
        out.float().square().mean().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    eager, grads = step()
    model.compile()
    compiled, compiled_grads = step()
    torch.testing.assert_close(compiled, eager, atol=1e-3, rtol=1e-3)
    for a, b in zip(compiled_grads, grads):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("variant", [name for name in variant_names()
                                     if "flex" in get_variant(name).backends and get_variant(name).cpu_graph])
@pytest.mark.slow
def test_a_compiled_model_on_flex_is_one_graph_with_the_draws_passed_in(variant):
    """``model.compile: true`` on the flex backend: the block stack, attention included, traces as one graph
    (``fullgraph=True`` raises at any break) for every variant that runs on FlexAttention, and two passes with
    different draws reuse it and equal the eager model. Dynamo's own trace (``backend="eager"``): Inductor's
    build of the same graph is the slow test above."""
    from torch._dynamo.utils import counters

    from sa_lightning.attention import AttentionSpec
    from sa_lightning.models import ModelConfig, build_model

    cfg = ModelConfig(vocab_size=128, n_layer=2, n_head=2, d_model=32, max_seq_len=256,
                      attention=AttentionSpec(variant, window=32, block_size=32, top_k=2, backend="flex"))
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    idx = torch.randint(0, 128, (2, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eager = [model(idx, perm_stream=stream) for stream in (0, 1)]
        torch._dynamo.reset()
        counters.clear()
        model.compile(fullgraph=True, backend="eager")
        for stream, expected in zip((0, 1), eager):
            torch.testing.assert_close(model(idx, perm_stream=stream), expected, atol=1e-5, rtol=0)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["recompiles"], dict(counters["stats"])


# ---- B2. model.compile: true ------------------------------------------------------------------------

@pytest.mark.slow
def test_model_compile_trains_the_tiny_config_on_cpu(tmp_path):
    """configs/tiny.yaml reduced in size (tests/configs/small.yaml: its callbacks and logger as shipped) with
    ``model.compile: true``. Before the attention kernels were kept out of the graph (``transformer._attend``)
    this died in Inductor's C++ build of the banded kernel's mask (torch 2.13)."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    cli = run(["fit", "--config", str(TINY), "--config", str(ROOT / "tests/configs/small.yaml"),
               "--model.compile", "true", "--trainer.max_steps", "2", "--trainer.default_root_dir", str(tmp_path)])
    assert cli.trainer.global_step == 2 and torch.isfinite(cli.trainer.callback_metrics["train/loss"])
    assert torch.isfinite(cli.trainer.callback_metrics["val/loss"])
    assert cli.model.net._compiled_blocks is not None and counters["stats"]["unique_graphs"] > graphs
    # compiled in place: the checkpoint's names are those of an uncompiled model, so it loads into one
    last = next(tmp_path.rglob("last.ckpt"))
    names = set(torch.load(last, map_location="cpu", weights_only=True)["state_dict"])
    assert names == {f"net.{k}" for k in LitLM(arch=cli.model.arch).net.state_dict()}


# ---- B4. FSDP ----------------------------------------------------------------------------------------

def _shipped_fsdp_strategy():
    """The strategy of configs/trainer/fsdp_4gpu.yaml, built from its YAML as the CLI builds it."""
    import yaml
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import FSDPStrategy

    spec = yaml.safe_load((ROOT / "configs/trainer/fsdp_4gpu.yaml").read_text())
    parser = ArgumentParser()
    parser.add_class_arguments(FSDPStrategy, "strategy")
    return parser.instantiate(parser.parse_object({"strategy": spec["strategy"]["init_args"]})).strategy, spec


def test_fsdp_strategy_of_the_shipped_config_wraps_blocks_and_round_trips_a_full_checkpoint_on_cpu(tmp_path):
    """Lightning 2.6 refuses FSDPStrategy unless the accelerator is CUDA (``test_training.py`` checks the
    message), and torch's FSDP refuses a CPU module unless ``device_id`` says cpu, which Lightning never
    passes there. So the shipped strategy's own settings go to torch's FSDP by hand, on a 1-rank gloo group,
    as Lightning's ``_setup_model`` passes them (with bf16-mixed's MixedPrecision), and the full state dict
    goes through Lightning's own save and load contexts. One rank runs NO_SHARD: the wrapping, the mixed
    precision, the optimizer step and the checkpoint are exercised, the sharded collectives are not."""
    import torch.distributed as dist
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from lightning.pytorch.strategies.fsdp import _get_full_state_dict_context, _load_raw_module_state
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

    from sa_lightning.lit import AtomicCheckpointIO
    from sa_lightning.models.checkpoint import read_checkpoint
    from sa_lightning.models import ModelConfig
    from sa_lightning.models.transformer import Block

    strategy, spec = _shipped_fsdp_strategy()
    assert (spec["accelerator"], spec["precision"]) == ("gpu", "bf16-mixed")
    assert strategy._state_dict_type == "full" and strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert set(strategy.kwargs["auto_wrap_policy"]._module_classes) == {Block, Qwen3DecoderLayer}
    precision = FSDPPrecision(spec["precision"])
    cfg = ModelConfig.from_name("tiny", n_layer=2, d_model=64, max_seq_len=64, window=16, block_size=8)

    def wrap(lit):
        return FSDP(lit, cpu_offload=strategy.cpu_offload, mixed_precision=precision.mixed_precision_config,
                    sharding_strategy=strategy.sharding_strategy, device_id=torch.device("cpu"), **strategy.kwargs)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = wrap(LitLM(arch=cfg))
        # the policy wraps exactly the Transformer++ blocks; embedding, final norm and head stay in the root
        assert [type(m.module).__name__ for m in model.modules() if isinstance(m, FSDP)] == ["LitLM", "Block", "Block"]
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = torch.randint(0, cfg.vocab_size, (4, 65), generator=torch.Generator().manual_seed(0))
        for step in range(2):
            with precision.forward_context():
                loss = LitLM.cross_entropy(model(batch[:, :-1], step), batch[:, 1:])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            assert torch.isfinite(loss)
        with _get_full_state_dict_context(model, world_size=1):
            state = model.state_dict()
        path = tmp_path / "last.ckpt"
        AtomicCheckpointIO().save_checkpoint({"state_dict": state}, path)  # the shipped config's checkpoint_io
        trained = {k: v.clone() for k, v in state.items()}
        assert any(not torch.equal(trained[f"net.{k}"], v) for k, v in LitLM(arch=cfg).net.state_dict().items())

        # Lightning's resume path (FSDPStrategy.load_checkpoint of a full checkpoint) into a fresh wrapped model
        resumed = wrap(LitLM(arch=cfg))
        _load_raw_module_state(read_checkpoint(path)["state_dict"], module=resumed, world_size=1)
        with _get_full_state_dict_context(resumed, world_size=1):
            again = resumed.state_dict()
        assert again.keys() == trained.keys() and all(torch.equal(again[k], trained[k]) for k in trained)
    finally:
        dist.destroy_process_group()
    # and a plain, unwrapped model starts from it (``model.init_weights``): full state dicts load anywhere
    plain = LitLM(arch=cfg, init_weights=str(path))
    assert all(torch.equal(v, trained[f"net.{k}"]) for k, v in plain.net.state_dict().items())


def test_draws_go_to_a_gpu_through_pinned_memory_without_blocking(monkeypatch):
    """layer_draws draws on the host, then ``to_device`` moves each draw: to a CUDA device from pinned memory with
    ``non_blocking`` (seen here through the two tensor methods, patched, on a machine without CUDA), to the CPU as
    it is; the values are the host's."""
    from sa_lightning.attention import AttentionSpec
    from sa_lightning.attention.draws import layer_draws

    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin") or self.clone())
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and str(args[0]).startswith("cuda"):
            calls.append(("to", str(args[0]), kwargs.get("non_blocking")))
            return self
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    for name in ("sa", "random"):
        spec = AttentionSpec(name, window=16)
        host = layer_draws(get_variant(name), spec, 64, range(3), seed=4)
        calls.clear()
        moved = layer_draws(get_variant(name), spec, 64, range(3), seed=4, device="cuda")
        assert calls == ["pin", ("to", "cuda", True)] * 3, calls
        assert all(torch.equal(a, b) for a, b in zip(host, moved))
        calls.clear()
        layer_draws(get_variant(name), spec, 64, range(3), seed=4, device="cpu")
        assert calls == []  # nothing pinned for the host itself


@pytest.mark.gpu
def test_a_steps_draws_reach_the_gpu_without_waiting_for_queued_work():
    """24 layers' σ for a 360M step go to the GPU from pinned memory without blocking: with about a second of
    work queued on the stream, drawing returns while that work still runs (a blocking copy would wait for it)."""
    import time

    from sa_lightning.attention import AttentionSpec
    from sa_lightning.attention.draws import layer_draws

    spec = AttentionSpec("sa", window=256)
    layer_draws(get_variant("sa"), spec, 2048, range(24), seed=0, device="cuda")  # pinned blocks cached
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # about a second of spinning queued on the current stream
    start = time.perf_counter()
    draws = layer_draws(get_variant("sa"), spec, 2048, range(24), seed=1, device="cuda")
    took = time.perf_counter() - start
    assert not torch.cuda.current_stream().query(), f"the queued work ended while drawing ({took:.2f} s): a sync"
    torch.cuda.synchronize()
    host = layer_draws(get_variant("sa"), spec, 2048, range(24), seed=1)
    assert all(torch.equal(d.cpu(), h) for d, h in zip(draws, host))
