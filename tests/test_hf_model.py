"""The Transformer++ as a transformers model: exported logits equal the checkpoint's, KV-cache generation equals
recomputing the whole sequence, `cli.py export` and `cli.py generate`, lm-eval's `hf` model, bad input."""
import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

import sa_lightning
from sa_lightning.attention import VARIANTS, AttentionSpec, oracle
from sa_lightning.attention.draws import layer_draws
from sa_lightning.lit.cli import run
from sa_lightning.models import ModelConfig, Transformer
from sa_lightning.models.export import export
from sa_lightning.models.hf_cache import cache_of
from sa_lightning.models.hf_model import SATransformerForCausalLM
from tests.helpers import fit_tiny_checkpoint, no_cache_rename_warning, run_cli_here

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/fast.yaml")]
N = 24


def _net(variant: str, seed: int = 0, **attention) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=128, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=64,
                      attention=AttentionSpec(variant, **{"window": 6, "block_size": 4, "top_k": 2, **attention}))
    net = Transformer(cfg).eval()
    with torch.no_grad():  # gates away from 0.5 and the paths distinguishable
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net


def _varied_net(variant: str, **attention) -> Transformer:
    """``_net`` with its residual branches 4x stronger. In ``_net`` the tied embedding dominates the logits, so
    greedy decoding repeats one token at every step, which a decoder that drops its KV cache repeats too; here
    the greedy tokens change from step to step."""
    net = _net(variant, **attention)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 2 and name != "embed.weight":
                p.mul_(4)
    return net


def _batch(lengths=(N, 17, 9), seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 128, (len(lengths), N), generator=g)
    lengths = torch.tensor(lengths)
    return ids, lengths, (torch.arange(N) < lengths[:, None]).long()


def _left(ids, lengths):
    """The same rows left-padded (as ``generate`` pads), and their mask."""
    left, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, n in enumerate(lengths.tolist()):
        left[b, N - n:], mask[b, N - n:] = ids[b, :n], 1
    return left, mask


# ---- 1. logits ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exported_folder_gives_the_checkpoints_logits_with_the_same_sigma_and_padding(variant, tmp_path):
    """Every variant, exported and loaded back by AutoModelForCausalLM, against the Transformer++ it came from:
    with the sigma evaluation draws (each row's own tokens), right- and left-padded, at most 1e-5 apart."""
    from transformers import AutoModelForCausalLM

    net = _net(variant)
    export(net, tmp_path / "hf")
    sa_lightning.register_with_transformers()  # what the README has a user do first
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert isinstance(hf, SATransformerForCausalLM)
    ids, lengths, mask = _batch()
    rows = [ids[b, :n].tolist() for b, n in enumerate(lengths.tolist())]
    perms = net.row_draws(rows, N, seed=0, mode="stochastic", device=None)  # evaluation's (a fixed σ: its trained one)
    left, left_mask = _left(ids, lengths)
    with torch.no_grad():
        want = net(ids, perms=perms, lengths=lengths)
        right = hf(ids, attention_mask=mask).logits
        lefts = hf(left, attention_mask=left_mask).logits
        given = hf(ids[:1], permutations=[p[:1] for p in perms] if perms else None).logits
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(right[b, :n], want[b, :n], atol=1e-5, rtol=0)
        torch.testing.assert_close(lefts[b, N - n:], want[b, :n], atol=1e-5, rtol=0)
    torch.testing.assert_close(given[0], want[0], atol=1e-5, rtol=0)
    if net.variant.draws:  # the sigma matters: another draw gives other logits
        other = layer_draws(net.variant, net.cfg.attention, N, range(2), seed=1, rows=rows[:1])
        assert (hf(ids[:1], permutations=other).logits - want[:1]).abs().max() > 1e-3


# ---- 2. generation with a KV cache --------------------------------------------------------------------
def _recomputed_logits(net, ids, prompt: int, decode: str) -> torch.Tensor:
    """The whole sequence at once under the cache's semantics: ``Transformer.forward`` (the training path) with each
    layer's kernel swapped for the float64 oracle, whose rows of the prompt read the variant's keys under the
    prompt's sigma, and every later row all earlier keys (dense), or for the SWA path the last w (window).
    Nothing of ``hf_model`` is used."""
    n, spec, variant = ids.shape[1], net.cfg.attention, net.variant
    draws = net.row_draws([ids[0, :prompt].tolist()], prompt, seed=0, mode="stochastic", device=None) \
        or [None] * len(net.blocks)  # evaluation's draw (a fixed σ: the one the model trained with)
    later = {name: oracle.swa_mask(n, spec.window) if decode == "window" and name == "swa" else oracle.full_mask(n)
             for name in variant.paths}

    def oracle_kernel(draw):
        def attend(q, k, v, spec, perm, lengths, validate):  # the draw the forward passes is for n tokens: unused
            heads = q.shape[1]
            paths = []
            for name, head in zip(variant.paths, variant.oracle_masks(spec, q[:, :, :prompt], k[:, :, :prompt], draw)):
                top = F.pad(head.expand(1, heads, prompt, prompt), (0, n - prompt))
                mask = torch.cat([top, later[name][:, :, prompt:].expand(1, heads, n - prompt, n)], dim=2)
                paths.append(oracle.reference_attention(q, k, v, mask))
            return tuple(paths)
        attend.runs_in_slots = lambda *args: False  # the oracle reads token order: no layer in slot order
        return attend

    reference = copy.deepcopy(net)
    for block, draw in zip(reference.blocks, draws):
        block.attn.variant = oracle_kernel(draw)
    return reference(ids)


@pytest.mark.parametrize("variant, decode", [(v, "dense") for v in VARIANTS] + [("swa", "window"),
                                                                                ("sa_swa", "window")])
@torch.no_grad()
def test_cached_greedy_generation_equals_recomputing_the_sequence_at_each_step(variant, decode):
    """``generate`` with its KV cache against the whole sequence recomputed without a cache at every step (the
    float64 oracle): the same logits at each step, hence the same tokens. The tokens vary, so a cache that is
    dropped (each step seeing only its newest token) cannot pass; nor may the cache's old name be warned about."""
    net = _varied_net(variant)
    hf = SATransformerForCausalLM.from_transformer(net, decode=decode).eval()
    prompt = torch.randint(1, 128, (1, 14), generator=torch.Generator().manual_seed(3))
    with no_cache_rename_warning():
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False,
                          pad_token_id=0, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    tokens = prompt
    for step, logits in enumerate(out.logits):
        want = _recomputed_logits(net, tokens, prompt.shape[1], decode)[:, -1]
        torch.testing.assert_close(logits, want, atol=1e-5, rtol=0, msg=f"step {step}")
        tokens = torch.cat([tokens, want.argmax(-1, keepdim=True)], dim=1)
    assert out.sequences.tolist() == tokens.tolist()
    assert len(set(tokens[0, prompt.shape[1]:].tolist())) > 1, "greedy tokens all alike: a dropped cache would pass"


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
@torch.no_grad()
def test_a_cache_passed_by_either_name_decodes_as_recomputing_without_one(name):
    """forward takes the KV cache as transformers >= 5.24 passes it (``cache``) and as older versions and their
    callers do (``past_key_values``), and returns it under the name the installed version reads. With full
    attention a cached step is exactly the whole sequence run again without a cache."""
    hf = SATransformerForCausalLM.from_transformer(_varied_net("full")).eval()
    ids, lengths, _ = _batch((N, N))
    with no_cache_rename_warning():
        step = hf(ids[:, :12], use_cache=True)
        for i in range(12, N):
            cache = cache_of(step)
            assert cache.get_seq_length() == i
            step = hf(ids[:, i:i + 1], use_cache=True, **{name: cache})
            whole = hf(ids[:, :i + 1], use_cache=False)
            assert cache_of(whole) is None
            torch.testing.assert_close(step.logits[:, -1], whole.logits[:, -1], atol=1e-5, rtol=0)
    assert len(set(whole.logits[0, 12:].argmax(-1).tolist())) > 1
    with pytest.raises(ValueError, match="pass the KV cache as cache or as past_key_values, not both"):
        hf(ids[:, :1], cache=DynamicCache(), past_key_values=DynamicCache())
    with pytest.raises(ValueError, match="cache must be a transformers Cache"):
        hf(ids[:, :1], cache=((torch.zeros(1),),))


@torch.no_grad()
def test_batched_left_padded_generation_gives_each_row_its_solo_tokens():
    """generate pads a batch on the left: every row must decode what it decodes alone (its own sigma, its own
    positions, no pad read)."""
    hf = SATransformerForCausalLM.from_transformer(_varied_net("sa_swa"), decode="window").eval()
    ids, lengths, _ = _batch((14, 9, 5))
    left, mask = _left(ids, lengths)
    batched = hf.generate(left, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                          eos_token_id=None)
    for b, n in enumerate(lengths.tolist()):
        solo = hf.generate(ids[b:b + 1, :n], max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
        assert batched[b, -6:].tolist() == solo[0, -6:].tolist()


# ---- 3. the commands, on a checkpoint `cli.py fit` wrote ------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return fit_tiny_checkpoint(tmp_path_factory.mktemp("fit"))


@pytest.fixture(scope="module")
def exported(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    res = run_cli_here("export", "--ckpt", str(checkpoint), "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    return out


def test_export_writes_model_tokenizer_and_card_and_generate_streams_the_same_greedy_text(checkpoint, exported):
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "sa_lightning_remote.py"} <= \
        {p.name for p in exported.iterdir()}
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "sa_transformer" and config["attention"]["variant"] == "sa_swa"
    args = ["--prompt", "ROMEO:", "--max_new_tokens", "6"]
    from_ckpt = run_cli_here("generate", "--ckpt", str(checkpoint), *args)
    from_folder = run_cli_here("generate", "--model", str(exported), *args)
    assert from_ckpt.returncode == 0 and from_folder.returncode == 0, from_ckpt.stderr[-2000:] + from_folder.stderr
    assert from_ckpt.stdout.startswith("ROMEO:") and from_ckpt.stdout == from_folder.stdout
    sampled = [run_cli_here("generate", "--ckpt", str(checkpoint), *args, "--temperature", "1.5", "--top_p", "0.9",
                            "--seed", str(seed)).stdout for seed in (0, 0, 1)]
    assert sampled[0] == sampled[1]  # seeded


@pytest.mark.slow
def test_generate_into_a_pipe_closed_early_ends_quietly(checkpoint):
    """Issue 51: ``generate ... | head -c 10`` ended in a "Broken pipe ... fix that path" error."""
    cmd = f"{sys.executable} cli.py generate --ckpt {checkpoint} --prompt ROMEO: --max_new_tokens 200 | head -c 3"
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == "ROM", res.stderr[-1000:]
    assert "Broken pipe" not in res.stderr and "Traceback" not in res.stderr


def test_each_prompt_of_a_file_draws_its_own_sample_and_the_file_is_reproducible(checkpoint, tmp_path):
    """Issue 51: the seed was reset before each prompt, so every prompt of a file drew the same sample."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ROMEO:\nROMEO:\nROMEO:\n")
    args = ["generate", "--ckpt", str(checkpoint), "--prompt_file", str(prompts), "--max_new_tokens", "8",
            "--temperature", "1.5", "--seed", "1"]
    first, again = run_cli_here(*args), run_cli_here(*args)
    assert first.returncode == 0 and first.stdout == again.stdout, first.stderr[-2000:]
    lines = first.stdout.strip().split("\n")
    continuations = [line.removeprefix("ROMEO:") for line in lines if line.startswith("ROMEO:")]
    assert len(continuations) == 3 and len(set(continuations)) > 1, first.stdout
    nan = run_cli_here("generate", "--ckpt", str(checkpoint), "--prompt", "x", "--temperature", "nan")
    assert nan.returncode != 0 and "--temperature must be a finite number >= 0" in nan.stderr.splitlines()[-1]


@pytest.mark.slow  # fresh interpreters: what a user's script sees, with and without the registration
def test_from_pretrained_needs_the_registration_or_trust_remote_code(exported):
    """``sa_lightning.register_with_transformers()`` registers the classes; importing sa_lightning alone
    changes nothing in transformers (or anywhere else in the process). One fresh process runs the steps in
    order (registration is for the whole process)."""
    script = f"""
from transformers import AutoModelForCausalLM as A, AutoTokenizer
def load(**kw):
    try:
        return type(A.from_pretrained({str(exported)!r}, **kw)).__name__
    except ValueError as err:
        return "refused: " + " ".join(str(err).split())
print("\\n@@bare", load())
import sa_lightning
print("\\n@@imported", load())
print("\\n@@tokenizer", AutoTokenizer.from_pretrained({str(exported)!r}).eos_token)  # needs no registration
sa_lightning.register_with_transformers()
print("\\n@@registered", load())
print("\\n@@remote", load(trust_remote_code=True))
"""
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    said = dict(line[2:].split(" ", 1) for line in out.stdout.splitlines() if line.startswith("@@"))
    assert out.returncode == 0, out.stderr[-2000:]
    for step in ("bare", "imported"):
        assert said[step].startswith("refused: ") and "trust_remote_code=True" in said[step], said
    assert said["tokenizer"].strip() and said["registered"] == said["remote"] == "SATransformerForCausalLM", said


@pytest.mark.slow  # lm-eval on the offline tasks, twice
def test_lm_evals_hf_model_on_the_folder_scores_what_evaluate_scores_on_the_checkpoint(checkpoint, exported):
    """batch_size 1: lm-eval's hf model passes no attention mask, so a padded batch would give SA rows a sigma
    over their padding too; one row per call is exactly the row evaluation scores."""
    from lm_eval.models.huggingface import HFLM

    import sa_lightning
    from sa_lightning.eval.harness import run_tasks
    from sa_lightning.eval.lm import SALM

    sa_lightning.register_with_transformers()  # what loads the folder without trust_remote_code
    ours = run_tasks(SALM(str(checkpoint), batch_size=4), ["offline"], limit=12)
    theirs = run_tasks(HFLM(pretrained=str(exported), backend="causal", device="cpu", dtype="float32", batch_size=1), ["offline"], limit=12)
    assert set(ours) == set(theirs) and ours
    for task, metrics in ours.items():
        for metric, value in metrics.items():
            assert theirs[task][metric] == pytest.approx(value, rel=1e-4, abs=1e-4), (task, metric)


@torch.no_grad()
def test_evaluations_generate_until_decodes_with_the_cache(checkpoint):
    """SALM's greedy generate_until is the cached model's greedy continuation, stopped at the stop string."""
    from sa_lightning.eval.lm import SALM

    class Request:
        args = ("ROMEO: What", {"until": ["\n\n"], "max_gen_toks": 8})

    lm = SALM(str(checkpoint))
    (text,) = lm.generate_until([Request()], disable_tqdm=True)
    ids = torch.tensor([lm.tok_encode("ROMEO: What")])
    out = lm.model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=lm.eot_token_id,
                                  pad_token_id=lm.eot_token_id)
    assert text == lm.tok_decode(out[0, ids.shape[1]:].tolist()).split("\n\n")[0]


# ---- bad input: one sentence each ---------------------------------------------------------------------
def test_bad_input_is_one_sentence(checkpoint, tmp_path):
    from sa_lightning.models.checkpoint import read_checkpoint

    with pytest.raises(ValueError, match="decode: window reads the last w keys of a local window, and full has none"):
        SATransformerForCausalLM.from_transformer(_net("full"), decode="window")
    with pytest.raises(ValueError, match="moba has none"):
        SATransformerForCausalLM.from_transformer(_net("moba"), decode="window")
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len=64"):
        SATransformerForCausalLM.from_transformer(_net("sa"))(torch.ones(1, 65, dtype=torch.long))
    res = run_cli_here("generate", "--ckpt", str(checkpoint), "--prompt", "x", "--temperature", "-0.5")
    assert res.returncode != 0 and "--temperature must be a finite number >= 0 (0 is greedy), got -0.5." in res.stderr
    res = run_cli_here("generate", "--ckpt", str(checkpoint), "--prompt", "ROMEO: " * 300)
    assert res.returncode != 0 and "and the model's max_seq_len is 64: it leaves no room" in res.stderr, res.stderr
    res = run_cli_here("generate", "--ckpt", str(checkpoint), "--prompt", "x", "--decode", "window",
                       "--max_new_tokens", "1")
    assert res.returncode == 0, res.stderr  # the shipped tiny model is sa_swa: its SWA path has a window
    ckpt = read_checkpoint(checkpoint)
    ckpt["state_dict"]["net.embed.weight"] = ckpt["state_dict"]["net.embed.weight"][:, :8]
    torch.save(ckpt, tmp_path / "edited.ckpt")
    res = run_cli_here("export", "--ckpt", str(tmp_path / "edited.ckpt"), "--out", str(tmp_path / "hf"))
    assert res.returncode != 0 and "holds weights whose sizes do not match its own architecture" in res.stderr
    assert "size mismatch for embed.weight" in res.stderr and not (tmp_path / "hf").exists()


def test_export_callback_writes_the_folder_at_the_end_of_fit_and_checks_decode_before_it(tmp_path):
    """configs/tiny.yaml's Transformer++ with ``ExportHF`` in trainer.callbacks: the folder loads back with the
    trained logits; ``decode: window`` on a variant without a local window stops before the first step."""
    from transformers import AutoModelForCausalLM

    callbacks = lambda decode: json.dumps([{"class_path": "sa_lightning.lit.ExportHF",  # noqa: E731
                                            "init_args": {"dirpath": str(tmp_path / "hf"), "decode": decode}}])
    cli = run(["fit", *BASE, "--trainer.max_steps", "1", "--trainer.default_root_dir", str(tmp_path),
               "--trainer.callbacks", callbacks("window")])
    sa_lightning.register_with_transformers()  # what the README has a user do first
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.decode == "window"
    ids = torch.randint(1, 4096, (1, 20))
    net = cli.model.net.eval()
    perms = layer_draws(net.variant, net.cfg.attention, 20, range(len(net.blocks)), seed=0, rows=[ids[0].tolist()])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, net(ids, perms=perms), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="and full has none"):
        run(["fit", *BASE, "--model.arch.attention.variant", "full", "--trainer.max_steps", "1",
             "--trainer.default_root_dir", str(tmp_path / "b"), "--trainer.callbacks", callbacks("window")])
    assert not (tmp_path / "b").exists() or not list((tmp_path / "b").rglob("*.ckpt"))


def test_bench_generate_times_both_paths_and_writes_the_table(tmp_path):
    from sa_lightning.bench.generate import main as bench_generate

    rows = bench_generate(["--shapes", "tiny", "--prompt", "8", "--new", "3", "--repeats", "1", "--out", str(tmp_path)])
    assert [r["shape"] for r in rows] == ["tiny"] and rows[0]["cached"] > 0 and rows[0]["recomputed"] > 0
    assert "| tiny | 1.4 |" in (tmp_path / "generate.md").read_text()
    res = run_cli_here("bench", "generate", "--shapes", "tiny", "--prompt", "250", "--new", "16", "--out", str(tmp_path / "b"))
    assert res.returncode != 0 and "exceeds the tiny model's max_seq_len=256" in res.stderr


@pytest.mark.gpu
@torch.no_grad()
def test_cached_generation_on_cuda_in_bfloat16_follows_the_float32_model():
    """The exported model where users run it: on CUDA (prefill through the flex backend ``auto`` picks there),
    in bf16. Its prefill logits stay near the fp32 CPU model's, and cached greedy decoding runs."""
    net = _net("sa_swa", backend="auto")
    want = SATransformerForCausalLM.from_transformer(net).eval()
    hf = SATransformerForCausalLM.from_transformer(_net("sa_swa", backend="auto")).cuda().to(torch.bfloat16).eval()
    ids, lengths, mask = _batch()
    got = hf(ids.cuda(), attention_mask=mask.cuda()).logits.float().cpu()
    ref = want(ids, attention_mask=mask).logits
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[b, :n], ref[b, :n], atol=0.1, rtol=0.05)
    out = hf.generate(ids[:1].cuda(), max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert out.shape == (1, N + 8)


def test_every_model_config_field_survives_a_folder():
    """ModelConfig -> SATransformerConfig -> ModelConfig keeps every field (the backbone's own aside): a field that
    a folder drops (the token shift once was) gives an exported model other logits than its checkpoint's."""
    from dataclasses import fields

    from sa_lightning.models.hf_config import SATransformerConfig

    changed = dict(vocab_size=97, n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_ff=40, max_seq_len=64,
                   attention=AttentionSpec("sa_fixed", window=8), permutation="deterministic", seed=7,
                   rope_theta=500.0, norm_eps=1e-5, init_std=0.03, token_shift=True)
    assert set(changed) == {f.name for f in fields(ModelConfig)} - {"backbone", "init_from"}  # a new field: add it
    cfg = ModelConfig(**changed)
    back = SATransformerConfig.from_model_config(cfg).to_model_config()
    assert back == cfg


def test_a_token_shift_model_exports_with_its_shift(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    net = Transformer(ModelConfig(vocab_size=64, n_layer=2, n_head=2, d_model=16, max_seq_len=N,
                                  attention=AttentionSpec("swa", window=4), token_shift=True)).eval()
    with torch.no_grad():
        net.shift.weight.normal_(0, 0.5)  # a trained shift, not its initial value
    export(net, tmp_path / "hf")
    sa_lightning.register_with_transformers()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(0, 64, (1, N))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, net(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant, depth", [("strided_local", None), ("radix", None), ("strided_local", 3)])
def test_an_exported_control_keeps_the_pattern_tuned_for_the_layers_it_trained_with(variant, depth, tmp_path):
    """A deterministic control's pattern follows the model's depth (``AttentionSpec.depth``; None: its layers): the
    exported folder's model runs the one the checkpoint ran, with its padding, and that pattern is not the
    fewest-layers one at these lengths (2 layers, w = 6: rows of 24 and 17 need 4-5)."""
    from transformers import AutoModelForCausalLM

    net = _net(variant, depth=depth)
    export(net, tmp_path / "hf")
    sa_lightning.register_with_transformers()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert {block.attn.spec.depth for block in [*net.blocks, *hf.model.blocks]} == {depth or 2}
    ids, lengths, mask = _batch()
    with torch.no_grad():
        want = net(ids, lengths=lengths)
        got = hf(ids, attention_mask=mask).logits
        fewest = copy.deepcopy(net)
        for block in fewest.blocks:  # the same weights, the pattern that needs the most layers: other logits
            block.attn.spec = AttentionSpec(variant, window=6, depth=10)
        other = fewest(ids, lengths=lengths)
    for b, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(got[b, :n], want[b, :n], atol=1e-5, rtol=0)
    assert (other[1, :17] - want[1, :17]).abs().max() > 1e-4
