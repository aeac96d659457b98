"""Zero-shot evaluation: the lm-eval model, the offline tasks, the tables, the callbacks, bad input."""
import json
import os
from pathlib import Path

import pytest
import torch

from sa_lightning.attention import VARIANTS, AttentionSpec, trained_variant_names
from sa_lightning.lit.cli import run
from sa_lightning.data.tokenizer import load_tokenizer
from sa_lightning.eval import offline
from sa_lightning.models.checkpoint import load_checkpoint
from sa_lightning.eval.harness import OFFLINE, TABLE1, load_tasks, resolve_tasks, run_tasks
from sa_lightning.eval.lm import SALM
from sa_lightning.eval.table import markdown_table
from sa_lightning.models import ModelConfig, Transformer
from tests.helpers import check_result_contract, fit_tiny_checkpoint, no_cache_rename_warning, run_cli_here

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/fast.yaml")]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded")


def _model(variant, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=4096, n_layer=2, n_head=4, n_kv_head=2, d_model=64, max_seq_len=128,
                      attention=AttentionSpec(variant, window=8, block_size=8, top_k=2), **kw)
    return Transformer(cfg)


def _requests(count=7, seed=0):
    """(key, context, continuation) token requests of mixed lengths, some longer than max_seq_len."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n_ctx = int(torch.randint(1, 150, (1,), generator=g))
        n_cont = int(torch.randint(1, 6, (1,), generator=g))
        toks = torch.randint(1, 4096, (n_ctx + n_cont,), generator=g).tolist()
        out.append((None, toks[:n_ctx], toks[n_ctx:]))
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return fit_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


# ---- the lm-eval model ----------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_scores_do_not_depend_on_batch_size_or_padding(variant, tokenizer):
    """Batch size 1 has no padding at all; any pad read by any variant would change the batched scores."""
    model = _model(variant)
    reqs = _requests()
    solo = SALM(model, tokenizer, batch_size=1)._loglikelihood_tokens(reqs, disable_tqdm=True)
    for batch_size in (3, 7):
        batched = SALM(model, tokenizer, batch_size=batch_size)._loglikelihood_tokens(reqs, disable_tqdm=True)
        assert [g for _, g in batched] == [g for _, g in solo]
        torch.testing.assert_close(torch.tensor([s for s, _ in batched]), torch.tensor([s for s, _ in solo]),
                                   atol=1e-4, rtol=1e-5)


def test_requests_with_one_input_row_share_its_scores(tokenizer):
    """Multiple choice with one-token answers: an input row is scored once, and each answer read from it."""
    model = _model("sa")
    context = list(range(1, 30))
    reqs = [(None, context, [answer]) for answer in (40, 41, 42)] + [(None, context[:-1], [context[-1], 43])]
    lm = SALM(model, tokenizer, batch_size=4)
    rows = []
    log_probs = lm.log_probs
    lm.log_probs = lambda batch, first: rows.extend(batch) or log_probs(batch, first)
    together = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    alone = [SALM(model, tokenizer)._loglikelihood_tokens([r], disable_tqdm=True)[0] for r in reqs]
    assert rows == [context]
    assert [g for _, g in together] == [g for _, g in alone]
    torch.testing.assert_close(torch.tensor([s for s, _ in together]), torch.tensor([s for s, _ in alone]))


def test_padded_rows_permute_only_their_own_tokens(tokenizer):
    lm = SALM(_model("sa"), tokenizer)
    rows = [[5] * 10, [6] * 4, [7] * 7]
    for perm in lm.model.draws(rows, 10, sample=0):
        for row, p in zip(rows, perm):
            assert sorted(p[:len(row)].tolist()) == list(range(len(row)))
            assert p[len(row):].tolist() == list(range(len(row), 10))


def test_stochastic_mode_is_seeded_and_deterministic_mode_is_fixed(tokenizer):
    model = _model("sa")
    rows = [list(range(1, 41)), list(range(100, 140))]  # two different inputs of one length
    stoch = SALM(model, tokenizer, seed=3)
    first, again = stoch.model.draws(rows, 40, 0), SALM(model, tokenizer, seed=3).model.draws(rows, 40, 0)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # reproducible
    assert not torch.equal(first[0][0], first[0][1])  # each input draws its own
    assert not torch.equal(first[0], SALM(model, tokenizer, seed=4).model.draws(rows, 40, 0)[0])
    assert not torch.equal(first[0], stoch.model.draws(rows, 40, 1)[0])  # draw 1 of each row is another sigma
    fixed = SALM(model, tokenizer, sa_mode="deterministic").model.draws(rows, 40, 0)
    assert torch.equal(fixed[0][0], fixed[0][1]) and not torch.equal(fixed[0][0], fixed[1][0])  # per layer


def test_eval_samples_average_the_probabilities_of_independent_draws(tokenizer):
    """K draws predict the mean of their probabilities (``models.ensemble``), draw s being the rows' draw s."""
    model = _model("sa_swa")
    rows = [w[1] for w in _requests(4)]
    rows = [r[:model.cfg.max_seq_len] for r in rows]
    averaged = SALM(model, tokenizer, eval_samples=3).log_probs(rows, 0)
    singles = []
    for k in range(3):
        lm = SALM(model, tokenizer)
        base = lm.model.draws
        lm.model.draws = lambda rows, n, sample=0, k=k, base=base: base(rows, n, sample + k)
        singles.append(lm.log_probs(rows, 0))
    assert not torch.allclose(singles[0], singles[1]) and not torch.allclose(singles[1], singles[2])  # they differ
    torch.testing.assert_close(averaged.exp(), torch.stack(singles).exp().mean(0), atol=1e-6, rtol=1e-5)
    assert SALM(_model("swa"), tokenizer, eval_samples=5).eval_samples == 1  # nothing to average


def test_the_evaluator_and_validation_give_one_k_sample_score():
    """``eval_samples`` means one thing: LitLM's validation and the checkpoint evaluator, handed the same K draws
    (validation's streams; the evaluator otherwise draws per input), give the same K-sample log-likelihoods."""
    from sa_lightning.lit import LitLM

    torch.manual_seed(0)
    lit = LitLM(arch=_model("sa").cfg, eval_samples=3).eval()
    batch = torch.randint(1, 4096, (3, 33))
    inputs, targets = lit.targets_of(batch)
    with torch.no_grad():
        validation = torch.log_softmax(lit.eval_scores(inputs, -1).float(), -1)  # validation's batch 0
    want = validation.gather(-1, targets[..., None]).squeeze(-1).sum(-1)

    lm = SALM(lit.net, load_tokenizer("embedded"), eval_samples=3)
    n = inputs.shape[1]
    lm.model.draws = lambda rows, width, sample=0: lit.net.draws(n, -1 * 3 - sample, lm.device)  # stream * K - s
    got = lm._loglikelihood_tokens([(None, row[:1], row[1:]) for row in batch.tolist()], disable_tqdm=True)
    torch.testing.assert_close(torch.tensor([ll for ll, _ in got]), want, atol=1e-3, rtol=1e-5)


@pytest.mark.slow
def test_evaluation_replaces_nothing_in_lm_eval():
    """PatchedHFLM used to swap ``lm_eval.models.huggingface.pad_and_concat`` for the length of each scoring call:
    no lm-eval module attribute is replaced, neither by importing the evaluators nor while they run."""
    import subprocess
    import sys

    script = """
import sys, lm_eval.api.model, lm_eval.models.huggingface, lm_eval.models.utils, lm_eval.models.utils_hf
def snapshot():
    return {(name, key): id(value) for name, module in list(sys.modules.items()) if name.split(".")[0] == "lm_eval"
            for key, value in list(vars(module).items())}
before = snapshot()
import sa_lightning.eval.lm, sa_lightning.inference.lm
after = snapshot()
print([key for key in before if after.get(key) != before[key]])
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", (out.stdout, out.stderr[-2000:])

    from sa_lightning.inference.lm import PatchedHFLM  # imports lm_eval.models.huggingface, which the old patch changed

    modules = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "lm_eval"}
    before = {(name, key): value for name, module in modules.items() for key, value in list(vars(module).items())}
    changed = []

    def check(*_):  # during each forward of the evaluation
        changed.extend(key for key, value in before.items() if vars(modules[key[0]]).get(key[1]) is not value)

    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = load_tokenizer("embedded")
    torch.manual_seed(0)
    qwen3 = Qwen3ForCausalLM(Qwen3Config(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=8)).eval()
    for lm in (SALM(_model("sa"), tokenizer, batch_size=3, eval_samples=2),
               PatchedHFLM(qwen3, tokenizer=tokenizer, variant="sa", window=8, batch_size=3)):
        handle = lm.model.register_forward_pre_hook(check)
        lm._loglikelihood_tokens(_requests(4), disable_tqdm=True)
        handle.remove()
    assert not changed, sorted(set(changed))[:5]


def test_rolling_loglikelihood_scores_every_token_once(tokenizer):
    from lm_eval.api.instance import Instance

    model = _model("full")
    text = "To be, or not to be, that is the question: " * 12
    lm = SALM(model, tokenizer, max_length=32)
    ids = lm.tok_encode(text)
    assert len(ids) > 3 * 32  # several windows
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)[0]
    # reference: every token scored once; each window reads the (up to) 32 tokens before its last target
    want, tokens = 0.0, [lm.eot_token_id] + ids
    with torch.no_grad():
        for start in range(0, len(ids), 32):
            end = min(start + 32, len(ids))
            logits = model(torch.tensor([tokens[max(0, end - 32):end]]))[0, -(end - start):]
            want += torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[start:end]).view(-1, 1)).sum().item()
    assert got == pytest.approx(want, rel=1e-5)


def test_generate_until_stops_at_the_stop_string_and_budget(tokenizer):
    from lm_eval.api.instance import Instance

    lm = SALM(_model("sa"), tokenizer)
    reqs = [Instance("generate_until", {}, ("HAMLET:\nTo be", {"until": ["\n"], "max_gen_toks": 6}), 0),
            Instance("generate_until", {}, ("Enter", {"until": ["zzz"], "max_gen_toks": 3}), 1)]
    out = lm.generate_until(reqs, disable_tqdm=True)
    assert len(out) == 2 and "\n" not in out[0]
    assert len(lm.tok_encode(out[1])) <= 3


# ---- offline tasks, harness, tables --------------------------------------------------------------
def test_shipped_offline_tasks_are_what_the_script_builds(tmp_path):
    built = offline.build(tmp_path)
    for name, path in built.items():
        assert path.read_bytes() == (offline.DATA_DIR / path.name).read_bytes(), name
    last = [json.loads(line) for line in (offline.DATA_DIR / "shakespeare_lastword.jsonl").open()]
    for doc in last:  # the target word occurs in the passage before it, as in LAMBADA
        context, target = doc["text"].rsplit(" ", 1)
        assert target.isalpha() and f"{target}" in context


def test_offline_tasks_load_through_the_task_manager():
    names = resolve_tasks("offline")
    assert names == list(offline.TASK_NAMES)
    tasks = load_tasks(names)
    assert {t.config.task for t in tasks} == set(names)
    assert all(len(list(t.test_docs())) > 40 for t in tasks)


@pytest.mark.slow
def test_tiny_model_on_the_offline_tasks(checkpoint):
    model, info = load_checkpoint(checkpoint)
    results = run_tasks(SALM(model, info["tokenizer"], batch_size=16), ["offline"], limit=8)
    assert set(results) == set(offline.TASK_NAMES)
    assert results["shakespeare_rolling"]["word_perplexity"] > 1
    assert 0 <= results["shakespeare_lastword"]["acc"] <= 1 and results["shakespeare_lastword"]["perplexity"] > 1
    assert 0 <= results["shakespeare_choice"]["acc_norm"] <= 1


def test_table_marks_best_bold_and_second_underlined():
    rows = {
        "Full": {"wikitext": {"word_perplexity": 51.34}, "piqa": {"acc": 0.599}, "arc_easy": {"acc": 0.358}},
        "SWA": {"wikitext": {"word_perplexity": 57.05}, "piqa": {"acc": 0.596}, "arc_easy": {"acc": 0.360}},
        "SA": {"wikitext": {"word_perplexity": 75.83}, "piqa": {"acc": 0.593}, "arc_easy": {"acc": 0.342}},
    }
    text = markdown_table(rows, TABLE1)
    header, _, full, swa, sa = text.strip().splitlines()
    assert header.split(" | ")[1:3] == ["Wiki. ppl ↓", "LMB-o ppl ↓"] and header.endswith("Avg. |")
    assert "**51.34**" in full and "<u>57.05</u>" in swa and "75.83 |" in sa  # lower is better
    assert "**59.9**" in full and "<u>59.6</u>" in swa  # accuracies in %
    assert "**36.0**" in swa and "<u>35.8</u>" in full
    assert "| – |" in full  # tasks not run
    assert full.rstrip(" |").endswith("**47.9**") or "47.8" in full or "47.9" in full  # avg of 59.9 and 35.8
    assert [c.task for c in OFFLINE] == ["shakespeare_rolling", "shakespeare_lastword", "shakespeare_lastword",
                                          "shakespeare_choice"]


# ---- the commands ------------------------------------------------------------------------------


def test_evaluate_scores_a_model_that_draws_under_five_sigma_seeds_and_one_that_draws_nothing_once():
    from sa_lightning.eval.evaluate import seeds_of
    from sa_lightning.experiments.evaluate import EXPERIMENT

    def info(variant):
        return {"arch": {"attention": {"variant": variant, "window": 8}}}

    assert EXPERIMENT.parse(["--ckpt", "x.ckpt"])[0].seeds is None
    for variant in VARIANTS:
        draws = VARIANTS[variant].draws and not VARIANTS[variant].frozen  # a frozen σ: every seed scores alike
        expected = [0, 1, 2, 3, 4] if draws else [0]
        assert seeds_of(info(variant), None) == expected, variant
        assert seeds_of(info(variant), [7, 8]) == ([7, 8] if draws else [7]), variant
    assert {v for v in VARIANTS if VARIANTS[v].draws} >= {"sa", "random", "sa_swa", "random_swa"}


@pytest.mark.slow
def test_evaluate_compares_checkpoints_in_one_table(checkpoint, tmp_path):
    from sa_lightning.experiments.evaluate import main

    from sa_lightning.utils.atomic import read_records

    report = main(["--ckpt", str(checkpoint), str(checkpoint), "--label", "a", "b", "--limit", "4",
                   "--seeds", "0", "1", "--out", str(tmp_path), "--baseline", "a"])
    assert set(report["models"]) == {"a", "b"}
    assert len(report["models"]["a"]["per_seed"]) == 2
    table = (tmp_path / "table.md").read_text()
    assert "| a |" in table and "| b |" in table and "Shk. ppl" in table and "Standard deviation" in table
    # the table says how many documents of each task it scored, not only the limit it was given
    assert "documents scored: " + ", ".join(f"{t} 4" for t in offline.TASK_NAMES) + " (the first 4 of each)" in table
    assert json.loads((tmp_path / "results.json").read_text())["config"]["tasks"] == list(offline.TASK_NAMES)
    compared = check_result_contract(tmp_path, "evaluate")["comparisons"]
    assert compared and {(r["a"], r["b"]) for r in compared} == {("b", "a")} and all(r["outcome"] for r in compared)
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    # per-item records of every (row, seed), and the table's numbers again with their intervals
    assert sorted("_".join(p.name.split("_")[:2]) for p in (tmp_path / "cells").glob("*.items.jsonl.gz")) == [
        f"{label}_s{seed}" for label in "ab" for seed in (0, 1)]
    records = read_records(next((tmp_path / "cells").glob("a_s1_*.items.jsonl.gz")))
    lastword = [r for r in records if r["task"] == "shakespeare_lastword"]
    assert len(lastword) == 4 and all("acc" in r["scores"] and len(r["ll"]) == 1 for r in lastword)
    model = report["models"]["a"]
    intervals = model["intervals"]
    assert set(intervals) == {"LW ppl", "LW", "MC"}  # the rolling perplexity is not a mean over documents
    for column, task, metric, scale in (("LW", "shakespeare_lastword", "acc", 100),
                                        ("MC", "shakespeare_choice", "acc_norm", 100),
                                        ("LW ppl", "shakespeare_lastword", "perplexity", 1)):
        ci = intervals[column]
        assert ci["items"] == 4 and ci["seeds"] == 2 and ci["lo"] <= ci["mean"] <= ci["hi"]
        assert ci["mean"] == pytest.approx(scale * model["mean"][task][metric], rel=1e-4)
    assert "With intervals" in table and "[" in table.split("With intervals")[1]
    # b is the same checkpoint at the same seeds: every paired difference is exactly 0; four documents are too few
    # for a 95% interval, so each is their range and no verdict
    rows = report["comparisons"]
    assert {(r["column"], r["unit"]) for r in rows} == {("LW ppl: NLL", "nats"), ("LW", "points"), ("MC", "points")}
    assert all(r["a"] == "b" and r["mean"] == 0 and r["verdict"] == "too few items to decide" for r in rows)
    assert "4 items: range [" in table
    assert "Each row minus a" in table


@pytest.mark.slow
def test_test_command_runs_the_zero_shot_tasks_and_logs_them(checkpoint, tmp_path):
    cli = run(["test", *BASE, "--ckpt_path", str(checkpoint), "--trainer.default_root_dir", str(tmp_path),
               "--trainer.logger", json.dumps({"class_path": "lightning.pytorch.loggers.CSVLogger",
                                               "init_args": {"save_dir": str(tmp_path)}}),
               "--trainer.callbacks", json.dumps([
                   {"class_path": "sa_lightning.lit.ZeroShotEval", "init_args": {"test_limit": 4}}])])
    written = list(tmp_path.rglob("test_step2.json"))
    assert written, list(tmp_path.rglob("*"))
    assert set(json.loads(written[0].read_text())) == set(offline.TASK_NAMES)
    # the table says how many documents it scored (issue 51: fit's 50 and test's all looked alike)
    assert written[0].with_suffix(".md").read_text().startswith("Zero-shot at step 2, the first 4 documents of each")
    assert "test/ppl" in cli.trainer.callback_metrics
    header = next(tmp_path.rglob("metrics.csv")).read_text().splitlines()[0]
    assert "eval/shakespeare_lastword/acc" in header and "eval/shakespeare_rolling/word_perplexity" in header


@pytest.mark.slow
def test_attention_maps_command_draws_every_variant(checkpoint, tmp_path):
    from sa_lightning.analysis.attention_maps import attention_maps

    model, info = load_checkpoint(checkpoint)
    fig, maps, labels = attention_maps(model, load_tokenizer(info["tokenizer"]), window=8)
    assert list(maps) == ["full", "swa", "sa", "sa_swa"] and len(labels) == 27
    for name, (weights, visible) in maps.items():
        assert weights.shape == (27, 27)
        assert torch.all(weights[~visible] == 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(27, dtype=weights.dtype))
        assert not visible.triu(1).any()  # causal
    assert maps["swa"][1].sum() < maps["sa_swa"][1].sum() <= maps["full"][1].sum()
    # the title says the window the masks are drawn at and the one the model trained with (issue 51: "w=8" alone,
    # for a model trained at w=32)
    title = fig._suptitle.get_text()
    assert "masks drawn at w=8" in title and f"trained at w={model.cfg.attention.window}" in title
    proc = run_cli_here("analyze", "attention-maps", "--ckpt", str(checkpoint), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "attention_maps.png").stat().st_size > 10_000


def test_sa_swa_attention_map_is_weighted_by_the_models_own_gates():
    """Figure 3: the SA+SWA panel mixes the two paths per query by g_sa and g_swa, read from the layer."""
    from sa_lightning.analysis.attention_maps import attention_maps, layer_gates, layer_qk, variant_maps
    from sa_lightning.models import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=4096, n_layer=2, n_head=4, d_model=32, max_seq_len=64,
                                    attention=AttentionSpec("sa_swa", window=8))).eval()
    with torch.no_grad():  # zero gate weights: sigmoid(0) = 0.5 for every query and channel
        model.blocks[1].attn.gate.gates["swa"].weight.zero_()
        model.blocks[1].attn.gate.gates["sa"].weight.zero_()
    idx = torch.randint(0, 4096, (1, 20), generator=torch.Generator().manual_seed(1))
    gates = layer_gates(model, idx, 1, head=2)
    assert set(gates) == {"sa", "swa"} and all(torch.allclose(g, torch.full((20,), 0.5, dtype=g.dtype)) for g in gates.values())
    gates = {"sa": torch.full((20,), 0.1, dtype=torch.float64), "swa": torch.full((20,), 0.3, dtype=torch.float64)}
    q, k = layer_qk(model, idx, 1)
    perm = model.draws(20, 0, "cpu")[1]
    maps = variant_maps(q, k, 2, ["sa", "swa", "sa_swa"], 8, perm=perm, gates=gates)
    expected = (0.1 * maps["sa"][0] + 0.3 * maps["swa"][0]) / 0.4  # by hand: a quarter SA, three quarters SWA
    torch.testing.assert_close(maps["sa_swa"][0], expected)
    torch.testing.assert_close(maps["sa_swa"][0].sum(-1), torch.ones(20, dtype=torch.float64))
    fig, _, _ = attention_maps(model, load_tokenizer("embedded"), layer=1, window=8)
    assert "weighted by its learned gates" in fig._suptitle.get_text()


@pytest.mark.parametrize("variant", [v for v in trained_variant_names() if VARIANTS[v].draws])
def test_attention_maps_of_every_drawing_model(variant):
    """The fit-end heat maps once crashed on a random-keys model: its draw (a key table with -1 padding) was
    taken for σ. Every model that draws must give Figure 3's maps."""
    from sa_lightning.analysis.attention_maps import attention_maps
    from sa_lightning.models import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=4096, n_layer=2, n_head=4, d_model=32, max_seq_len=64,
                                    attention=AttentionSpec(variant, window=8))).eval()
    _, maps, labels = attention_maps(model, load_tokenizer("embedded"), layer=1, window=8)
    assert list(maps) == ["full", "swa", "sa", "sa_swa"] and len(labels) == 27


# ---- bad input: one clear sentence ---------------------------------------------------------------
def test_unknown_task_lists_close_matches():
    with pytest.raises(ValueError, match=r"unknown task 'lambada_opnai'.*Close matches: lambada_openai"):
        resolve_tasks(["lambada_opnai"])


@pytest.mark.slow
def test_network_only_task_offline_points_to_the_offline_tasks():
    with pytest.raises(ValueError, match=r"task 'piqa' needs its dataset .* cannot be had offline.*--tasks offline"):
        load_tasks(["piqa"])


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    (b"not a checkpoint at all", "cannot be read"),
    ("foreign", "not an sa_lightning checkpoint"),
])
def test_bad_checkpoints_fail_in_one_sentence(content, message, tmp_path):
    from sa_lightning.experiments.evaluate import main

    path = tmp_path / "model.ckpt"
    if content == "foreign":
        torch.save({"state_dict": {"w": torch.zeros(1)}}, path)
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises((ValueError, FileNotFoundError), match=message) as err:
        main(["--ckpt", str(path), "--out", str(tmp_path / "out")])
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_missing_checkpoint_in_the_cli_is_one_line(tmp_path):
    proc = run_cli_here("evaluate", "--ckpt", str(tmp_path / "nope.ckpt"), "--out", str(tmp_path / "out"))
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: checkpoint '{tmp_path / 'nope.ckpt'}' does not exist")


@pytest.mark.slow
def test_truncated_checkpoint_is_refused(checkpoint, tmp_path):
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(checkpoint.read_bytes()[:4000])
    with pytest.raises(ValueError, match="cannot be read"):
        load_checkpoint(cut)


@pytest.mark.slow
def test_unknown_task_in_the_cli_fails_before_scoring(checkpoint, tmp_path):
    proc = run_cli_here("evaluate", "--ckpt", str(checkpoint), "--tasks", "hellaswg", "--out", str(tmp_path))
    assert proc.returncode != 0
    assert "error: unknown task 'hellaswg'" in proc.stderr and "hellaswag" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_baseline_that_is_the_only_row_is_refused_before_scoring(checkpoint, tmp_path):
    """It printed an empty comparison table (issue 66)."""
    proc = run_cli_here("evaluate", "--ckpt", str(checkpoint), "--label", "A", "--baseline", "A", "--out",
                        str(tmp_path / "out"))
    assert proc.returncode != 0 and "--baseline 'A' is the only row" in proc.stderr and "another --ckpt" in proc.stderr
    assert not (tmp_path / "out" / "cells").exists()


@pytest.mark.slow
def test_bench_eval_reports_permutation_noise_per_eval_samples(checkpoint, tmp_path):
    from sa_lightning.bench.eval import main

    main(["--ckpt", str(checkpoint), "--samples", "1", "2", "--seeds", "3", "--requests", "6", "--skip_timing",
          "--out", str(tmp_path)])
    table = (tmp_path / "eval.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2
    k1, k2 = (float(r.split(" | ")[1]) for r in rows)
    assert k1 > 0 and k2 > 0  # SA scores really vary with the seed


@pytest.mark.parametrize("variant", ["sa", "sa_swa_union", "moba"])
def test_qwen3_backbone_scores_do_not_depend_on_batch_size(variant, tokenizer):
    from sa_lightning.models import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=4096, n_layer=2, n_head=4, n_kv_head=2, d_model=64, max_seq_len=128,
                                    attention=AttentionSpec(variant, window=8, block_size=8), backbone="qwen3")).eval()
    reqs = _requests(5)
    solo = SALM(model, tokenizer, batch_size=1)._loglikelihood_tokens(reqs, disable_tqdm=True)
    batched = SALM(model, tokenizer, batch_size=5)._loglikelihood_tokens(reqs, disable_tqdm=True)
    torch.testing.assert_close(torch.tensor([s for s, _ in batched]), torch.tensor([s for s, _ in solo]),
                               atol=1e-4, rtol=1e-5)


@torch.no_grad()
def test_qwen3_backbones_generate_until_decodes_with_its_cache_as_recomputing_without_one(tokenizer):
    """The Qwen3 backbone decodes through the patched Hugging Face model, handing it the KV cache under the name the
    installed transformers takes (Qwen3 drops ``past_key_values`` in 5.40). In full mode its greedy text is what
    recomputing the whole sequence at every step gives; residual branches 4x stronger make the tokens vary."""
    from lm_eval.api.instance import Instance

    from sa_lightning.models import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=4096, n_layer=2, n_head=4, n_kv_head=2, d_model=64, max_seq_len=128,
                                    attention=AttentionSpec("full"), backbone="qwen3")).eval()
    for name, p in model.named_parameters():
        if p.dim() == 2 and "embed" not in name:
            p.mul_(4)
    lm = SALM(model, tokenizer)
    with no_cache_rename_warning():
        (text,) = lm.generate_until([Instance("generate_until", {}, ("HAMLET:\nTo be, or not", {"until": [],
                                                                                             "max_gen_toks": 8}), 0)],
                                    disable_tqdm=True)
    ids, want = lm.tok_encode("HAMLET:\nTo be, or not"), []
    for _ in range(8):
        want.append(int(model(torch.tensor([ids + want]))[0, -1].argmax()))
    assert text == lm.tok_decode(want) and len(set(want)) > 1, (text, want)


@pytest.mark.slow
def test_local_pass_at_k_runs_programs_in_a_subprocess_with_a_timeout():
    import sys

    sys.path.insert(0, str(offline.TASKS_DIR))
    try:
        import code_exec
    finally:
        sys.path.remove(str(offline.TASKS_DIR))
    test = "def check(f):\n    assert f(2, 3) == 5\ncheck(add)"
    good, bad, hang = "def add(a, b):\n    return a + b", "def add(a, b):\n    return a * b", \
        "def add(a, b):\n    while True: pass"
    assert code_exec.pass_at_k([test], [[good]], k=[1]) == 1.0
    assert code_exec.pass_at_k([test], [[bad]], k=[1]) == 0.0
    assert code_exec.passes(f"{hang}\n{test}", timeout=1.0) is False
    assert code_exec.pass_at_k([test], [[good, bad]], k=[1]) == 0.5
    assert code_exec.estimate_pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert "humaneval_exec" in resolve_tasks(["humaneval_exec"])


@pytest.mark.slow
def test_a_group_task_is_reported_with_its_aggregate(checkpoint, tmp_path, monkeypatch):
    """Groups such as mmlu must reach lm-eval by name, or their aggregate (the table's column) is lost."""
    from lm_eval.tasks import TaskManager

    from sa_lightning.eval import harness

    (tmp_path / "group.yaml").write_text(
        "group: offline_pair\ntask:\n  - shakespeare_lastword\n  - shakespeare_choice\n"
        "aggregate_metric_list:\n  - metric: acc\n    aggregation: mean\n    weight_by_size: true\n")
    manager = TaskManager(include_path=[str(offline.TASKS_DIR), str(tmp_path)], include_defaults=False)
    monkeypatch.setattr(harness, "task_manager", lambda defaults=True: manager)
    monkeypatch.setattr(harness, "known_task_names", lambda: set(manager.all_tasks))  # not the cached real names
    model, info = load_checkpoint(checkpoint)
    results = harness.run_tasks(SALM(model, info["tokenizer"]), ["offline_pair"], limit=3)
    assert "acc" in results["offline_pair"] and "acc" in results["shakespeare_lastword"]


@pytest.mark.slow
def test_test_and_validate_with_ckpt_path_last_say_what_they_score_and_where_results_go(checkpoint, tmp_path):
    """``cli.py test --ckpt_path last`` said "resuming", and reported the validation blocks as "test" without
    saying so: it says "testing <file>", names the new logger version its results go to, and says once that the
    test set is the validation split. ``validate`` says "validating <file>" and nothing about a test set."""
    import shutil

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ckpt = run_dir / "last.ckpt"
    shutil.copy(checkpoint, ckpt)
    logger = json.dumps({"class_path": "lightning.pytorch.loggers.CSVLogger",
                         "init_args": {"save_dir": str(run_dir), "name": "logs"}})
    common = [*BASE, "--trainer.default_root_dir", str(run_dir), "--ckpt_path", "last", "--trainer.logger", logger]
    test = run_cli_here("test", *common)
    assert test.returncode == 0, test.stderr[-3000:]
    said = test.stdout + test.stderr
    assert f"--ckpt_path last: testing {ckpt}" in said and "resuming" not in said, said[-3000:]
    assert f"cli.py test: scoring the checkpoint {ckpt}; results go to {run_dir / 'logs' / 'version_0'}" in said
    assert said.count("the test set is LMDataModule's validation split") == 1
    assert "test/loss" in (run_dir / "logs" / "version_0" / "metrics.csv").read_text()
    validate = run_cli_here("validate", *common)
    assert validate.returncode == 0, validate.stderr[-3000:]
    said = validate.stdout + validate.stderr
    assert f"--ckpt_path last: validating {ckpt}" in said and "resuming" not in said and "test set" not in said
    assert f"cli.py validate: scoring the checkpoint {ckpt}; results go to {run_dir / 'logs' / 'version_1'}" in said


def test_evaluate_never_writes_over_a_users_files_and_a_stop_keeps_the_previous_set(checkpoint, tmp_path, monkeypatch):
    """Issue 48: ``evaluate --out DIR`` wrote over a user's table.md there without asking, and a Ctrl-C left the
    previous run's per-item records half replaced."""
    import signal

    import sa_lightning.eval.harness as harness
    import sa_lightning.experiments.evaluate as evaluate
    from sa_lightning.utils.runner import Stopped

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "table.md").write_text("my notes\n")
    args = ["--ckpt", str(checkpoint), "--tasks", "shakespeare_lastword", "--limit", "3", "--seeds", "0", "1"]
    import sa_lightning.models.checkpoint as checkpoints

    loads = []  # the folder is refused before any checkpoint loads (a large one takes a while)
    monkeypatch.setattr(checkpoints, "load_checkpoint", lambda path, real=checkpoints.load_checkpoint:
                        loads.append(path) or real(path))
    with pytest.raises(ValueError, match="holds other files and no evaluation of its own .* or pass --overwrite"):
        evaluate.main([*args, "--out", str(mine)])
    assert not loads
    assert (mine / "table.md").read_text() == "my notes\n" and sorted(p.name for p in mine.iterdir()) == ["table.md"]
    (mine / "notes.txt").write_text("keep me\n")
    evaluate.main([*args, "--out", str(mine), "--overwrite"])  # only the evaluation's own names replaced
    assert (mine / "notes.txt").read_text() == "keep me\n" and "Zero-shot" in (mine / "table.md").read_text()

    out = tmp_path / "eval"
    evaluate.main([*args, "--out", str(out)])
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")
              and "tb" not in p.parts}
    calls = []
    real = harness.run_tasks_with_items

    def interrupted(*a, **k):  # a Ctrl-C while the second cell of a new run is scored
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)

    monkeypatch.setattr(harness, "run_tasks_with_items", interrupted)
    # as a terminal starts it: a suite run as a background job inherits SIGINT ignored, which the runner keeps
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Stopped) as stopped:
            evaluate.main([*args[:-3], "--limit", "4", "--seeds", "0", "1", "--out", str(out)])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped.value.code == 128 + signal.SIGINT
    after = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")
             and "tb" not in p.parts}
    assert {k: after[k] for k in before} == before  # the previous set, records included, byte for byte
    report = json.loads((out / "results.json").read_text())
    assert all((out / f).is_file() for m in report["models"].values() for f in m["items"])


@pytest.mark.slow
def test_evaluates_tensorboard_folder_is_written_with_its_set_and_replaced_whole(checkpoint, tmp_path, capsys):
    """Issue 77: ``tb/`` was written outside the set of files a run replaces together (a failed report left new
    scalars beside the old table) and grew by one events file per run. Now it is one of the set, replaced whole; a
    folder of an earlier version, whose ``tb/`` no record names, is refused before any cell and ``cli.py migrate``
    claims it."""
    from sa_lightning.experiments.evaluate import main
    from sa_lightning.main import main as cli
    from sa_lightning.utils.atomic import MANIFEST

    args = ["--ckpt", str(checkpoint), "--label", "a", "--limit", "2", "--seeds", "0", "--out", str(tmp_path)]
    main(args)
    main(args)
    assert len(list((tmp_path / "tb" / "a").glob("events.out.tfevents.*"))) == 1
    manifest = tmp_path / MANIFEST
    written = json.loads(manifest.read_text())
    assert written["tb"] == "evaluation report"
    del written["tb"]  # as an earlier version left it
    manifest.write_text(json.dumps(written))
    with pytest.raises(ValueError, match="holds 'tb', which the evaluation would replace.* Where an earlier evaluate "
                                         "wrote tb without recording it, `python cli.py migrate "):
        main(args)
    capsys.readouterr()
    cli(["migrate", str(tmp_path)])
    assert "1 updated" in capsys.readouterr().out
    main(args)
    assert len(list((tmp_path / "tb" / "a").glob("events.out.tfevents.*"))) == 1


def test_the_lm_eval_model_builds_without_hflms_warnings_for_a_built_model(tokenizer, caplog):
    """HFLM warned twice before every evaluation ("`pretrained` model kwarg is not of type `str`", "Passed an
    already-initialized model") though every call here passes its own built model on purpose (issue 66); its
    other lines still come through."""
    import logging

    with caplog.at_level(logging.WARNING, logger="lm_eval"):
        SALM(_model("sa"), tokenizer)
        logging.getLogger("lm_eval.models.huggingface").warning("another line")
    said = [r.getMessage() for r in caplog.records]
    assert "another line" in said
    assert not [m for m in said if "not of type `str`" in m or "already-initialized" in m], said


def test_evaluate_runs_without_its_config_where_none_is_at_hand(monkeypatch, tmp_path):
    """A wheel ships no configs/: evaluate then reads the flags over its dataclass's defaults (the same values as
    configs/evaluate.yaml's top level), while a --config that is missing is still refused."""
    from sa_lightning.experiments import base
    from sa_lightning.experiments.evaluate import EXPERIMENT

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(base, "default_config", lambda name: name)  # not in the working folder, no checkout
    cfg, preset, how = EXPERIMENT.parse(["--ckpt", "x.ckpt", "--limit", "4"])
    assert (cfg.ckpt, cfg.limit, cfg.batch_size, cfg.out, preset, how.compare) == (["x.ckpt"], 4, 32, "outputs/eval",
                                                                                   None, False)
    with pytest.raises(SystemExit, match="evaluate config gone.yaml not found"):
        EXPERIMENT.parse(["--ckpt", "x.ckpt", "--config", "gone.yaml"])
    shipped = base.load_yaml(str(base.Path(__file__).resolve().parents[1] / "configs/evaluate.yaml"))
    defaults = {k: v for k, v in vars(cfg).items() if k in shipped}
    assert {k: v for k, v in shipped.items() if k not in ("presets", "tasks", "limit")} == \
        {k: v for k, v in defaults.items() if k not in ("tasks", "limit")}


def test_evaluate_compare_before_every_cell_is_scored_is_one_sentence(tmp_path):
    """``--compare`` is a flag of every experiment; an evaluation's table needs each (checkpoint, σ seed) cell, so a
    look before they are all scored says how many are done instead of pairing the wrong records."""
    import copy

    from sa_lightning.experiments.evaluate import EXPERIMENT

    cfg = EXPERIMENT.parse(["--ckpt", "x.ckpt", "--compare"])[0]
    run = copy.copy(EXPERIMENT)
    run.seeds = {"a": [0, 1]}
    with pytest.raises(ValueError, match=r"needs every \(checkpoint, σ seed\) cell, and 1 of 2 are done in .*cells; "
                                         r"run it without --compare"):
        run.report(cfg, [{"label": "a", "seed": 0}], tmp_path)
