"""More bad input, each ending in one sentence before any long work (docs/bad_input.md, rows 77 on): a device
the machine lacks, a bare dict as --ckpt_path, a bare state dict as model.init_weights, a folder in data paths,
generate's model and prompt paths, a tokenizer path that does not exist, evaluate's negative --limit and --seeds."""
from pathlib import Path

import pytest
import torch

from sa_lightning.data.corpus import resolve_files
from sa_lightning.data.tokenizer import load_tokenizer
from sa_lightning.lit.cli import run
from tests.helpers import run_cli_here

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--config", str(ROOT / "configs/tiny.yaml"), "--config", str(ROOT / "tests/configs/fast.yaml")]


def _line(res) -> str:
    """The last line a command printed on stderr (the one-line error), with no traceback before it."""
    assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return res.stderr.strip().splitlines()[-1]


# ---- 77: --device cuda on a machine without CUDA --------------------------------------------------------
def test_a_device_the_machine_lacks_is_one_sentence_before_anything_loads(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    missing = str(tmp_path / "none.ckpt")  # the device is refused before this checkpoint is looked for
    for args in (["generate", "--ckpt", missing, "--prompt", "x", "--device", "cuda"],
                 ["bench", "generate", "--device", "cuda", "--out", str(tmp_path / "bench")],
                 ["bench", "prefill", "--device", "cuda", "--out", str(tmp_path / "bench")],
                 ["evaluate", "--ckpt", missing, "--device", "cuda", "--out", str(tmp_path / "eval")]):
        line = _line(run_cli_here(*args))
        assert line.startswith("error: --device cuda was asked for, but this machine has no CUDA GPU that PyTorch "
                               "can use (") and "use --device cpu" in line, (args, line)
    assert not (tmp_path / "bench").exists() and not (tmp_path / "eval").exists()
    line = _line(run_cli_here("generate", "--ckpt", missing, "--prompt", "x", "--device", "gpu"))
    assert line.startswith("error: --device 'gpu' is not a device PyTorch knows (a GPU is cuda); use --device cpu")


# ---- 78: a bare torch.save({...}) as --ckpt_path --------------------------------------------------------
def test_a_bare_dict_as_ckpt_path_says_what_it_holds_and_the_way_in(tmp_path):
    bare, weights, tensor = tmp_path / "bare.pt", tmp_path / "weights.pt", tmp_path / "tensor.pt"
    torch.save({"weights": torch.zeros(3), "step": 5}, bare)
    torch.save({"embed.weight": torch.zeros(2, 2), "head.weight": torch.zeros(2)}, weights)
    torch.save(torch.zeros(3), tensor)
    root = ["--trainer.default_root_dir", str(tmp_path / "run"), "--data.max_train_tokens", "20000"]
    line = _line(run_cli_here("fit", *BASE, *root, "--ckpt_path", str(bare)))
    assert line == (f"error: checkpoint '{bare}' is not a Lightning checkpoint written by `cli.py fit`: it holds a "
                    f"dict with the top-level keys 'weights', 'step'; for bare weights (a state dict), pass "
                    f"--model.init_weights {bare} instead of --ckpt_path.")
    for command in ("validate", "test"):
        line = _line(run_cli_here(command, *BASE, *root, "--ckpt_path", str(weights)))
        assert "is not a Lightning checkpoint written by `cli.py fit`: it holds a bare state dict of 2 tensors " \
               "('embed.weight', 'head.weight'); for bare weights (a state dict), pass --model.init_weights" in line
    line = _line(run_cli_here("validate", *BASE, *root, "--ckpt_path", str(tensor)))
    assert line == f"error: checkpoint '{tensor}' holds a Tensor, not a dict of weights; pass a checkpoint " \
                   "`cli.py fit` wrote (or, for model.init_weights, a state dict)."


# ---- 79: a bare net.state_dict() as --model.init_weights ------------------------------------------------
def test_a_bare_state_dict_that_fits_starts_the_run_and_a_mismatch_names_its_first_key(tmp_path):
    root = ["--trainer.default_root_dir", str(tmp_path / "run")]
    net = run([*BASE, *root], run=False).model.net
    saved = {k: v + 0.25 for k, v in net.state_dict().items()}  # not what a fresh model of this seed holds
    plain, prefixed = tmp_path / "net.pt", tmp_path / "lit.pt"
    torch.save(saved, plain)
    torch.save({f"net.{k}": v for k, v in saved.items()}, prefixed)  # the LightningModule's names
    for path in (plain, prefixed):
        loaded = run([*BASE, *root, "--model.init_weights", str(path)], run=False).model.net.state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in saved.items())

    edited = dict(saved)
    edited.pop("blocks.1.mlp.up.weight")
    edited["blocks.9.extra.weight"] = torch.zeros(1)
    torch.save(edited, tmp_path / "edited.pt")
    line = _line(run_cli_here("validate", *BASE, *root, "--model.init_weights", str(tmp_path / "edited.pt")))
    assert line == (f"error: model.init_weights '{tmp_path / 'edited.pt'}' does not fit this model: "
                    "blocks.1.mlp.up.weight is missing there; blocks.9.extra.weight has no place here (1 missing, "
                    "1 extra parameters); drop init_weights, or pass weights of a model with this one's layers and "
                    "variant.")
    line = _line(run_cli_here("validate", *BASE, *root, "--model.init_weights", str(plain),
                              "--model.arch.attention.variant", "swa"))  # the gates are named only where they differ
    assert "blocks.0.attn.gate.gates.attn.weight is missing there; blocks.0.attn.gate.gates.sa.weight has no " \
           "place here" in line and "sa_swa has two output gates" in line
    torch.save({f"model.{k}": v for k, v in saved.items()}, tmp_path / "other.pt")
    line = _line(run_cli_here("validate", *BASE, *root, "--model.init_weights", str(tmp_path / "other.pt")))
    assert f"does not fit this model: none of its {len(saved)} parameter names is one of this model's (its first " \
           "is model.blocks.0." in line
    torch.save({"weights": torch.zeros(3), "step": 5}, tmp_path / "bare.pt")
    line = _line(run_cli_here("validate", *BASE, *root, "--model.init_weights", str(tmp_path / "bare.pt")))
    assert line.endswith("holds neither a checkpoint `cli.py fit` wrote nor a state dict of tensors: it holds a dict "
                         "with the top-level keys 'weights', 'step'.")


# ---- 80: a folder in data paths -------------------------------------------------------------------------
def test_a_folder_in_data_paths_is_called_a_folder_with_a_glob_for_its_files(tmp_path):
    (tmp_path / "corpus" / "shards").mkdir(parents=True)
    for name in ("a.jsonl", "b.jsonl", "c.parquet"):
        (tmp_path / "corpus" / "shards" / name).write_text("")
    folder = tmp_path / "corpus"
    with pytest.raises(IsADirectoryError, match=r"^data path '.*corpus' is a folder, not a data file; name its files "
                                                r"with a glob, e.g. '.*corpus/\*\*/\*\.jsonl'\.$"):
        resolve_files([str(folder)])
    with pytest.raises(IsADirectoryError, match=r"e\.g\. '.*corpus/shards/\*\.jsonl'"):
        resolve_files([str(folder / "*")])  # a glob that matches a folder
    line = _line(run_cli_here("fit", *BASE, "--trainer.default_root_dir", str(tmp_path / "run"),
                              "--data.train.kind", "files", "--data.train.paths", f"[{folder / 'shards'}]"))
    assert line == (f"error: data path '{folder / 'shards'}' is a folder, not a data file; name its files with a glob, "
                    f"e.g. '{folder / 'shards' / '*.jsonl'}'.")


# ---- 81: generate --model that is not a model, --prompt_file a folder ----------------------------------
def test_generate_names_what_is_wrong_with_a_model_or_prompt_path(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hello")
    (tmp_path / "run.ckpt").write_bytes(b"")
    cases = {
        str(tmp_path / "notes"): f"error: --model '{tmp_path / 'notes'}' is a folder but not a model: it holds no "
                                 "config.json (an exported or Hugging Face model folder has one); pass the folder "
                                 "`cli.py export` wrote, or a checkpoint with --ckpt.",
        str(tmp_path / "no" / "such"): f"error: --model '{tmp_path / 'no' / 'such'}' does not exist; pass an exported "
                                       "or Hugging Face model folder, a Hub id or a fetched name (smollm2).",
        str(tmp_path / "run.ckpt"): f"error: --model '{tmp_path / 'run.ckpt'}' is a checkpoint file, not a model "
                                    "folder; pass it with --ckpt instead.",
        "no-such-org/no-such-model": "error: --model 'no-such-org/no-such-model' is not a local folder (no such path), "
                                     "and as a Hub id it is not in the local cache, and HF_HUB_OFFLINE=1 keeps the Hub "
                                     "from being asked; pass an exported model folder, or a checkpoint with --ckpt.",
    }
    for model, expected in cases.items():
        assert _line(run_cli_here("generate", "--model", model, "--prompt", "x")) == expected
    line = _line(run_cli_here("generate", "--ckpt", str(tmp_path / "none.ckpt"),
                              "--prompt_file", str(tmp_path / "notes")))
    assert line == f"error: --prompt_file '{tmp_path / 'notes'}' is a folder; pass a text file in it, with one " \
                   "prompt per line."
    latin = tmp_path / "prompts.txt"
    latin.write_bytes("café\n".encode("latin-1"))  # issue 51: named neither the file nor the flag
    line = _line(run_cli_here("generate", "--ckpt", str(tmp_path / "none.ckpt"), "--prompt_file", str(latin)))
    assert line == f"error: --prompt_file '{latin}' is not UTF-8 text (byte 3: invalid continuation byte); save it " \
                   "as UTF-8, with one prompt per line."


# ---- 82: a tokenizer path that does not exist -----------------------------------------------------------
def test_a_tokenizer_path_that_does_not_exist_says_so(tmp_path):
    for name in (str(tmp_path / "tok.json"), str(tmp_path / "tokenizer"), "./no_such_tokenizer"):
        with pytest.raises(FileNotFoundError, match=rf"^tokenizer '{name}' does not exist; pass an existing "
                                                     r"tokenizer.json file or tokenizer folder"):
            load_tokenizer(name)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is a folder without a tokenizer"):
        load_tokenizer(str(tmp_path / "empty"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="is a file but not a tokenizer.json"):
        load_tokenizer(str(tmp_path / "notes.txt"))
    line = _line(run_cli_here("fit", *BASE, "--trainer.default_root_dir", str(tmp_path / "run"),
                              "--data.tokenizer", str(tmp_path / "tok.json")))
    assert line == f"error: tokenizer '{tmp_path / 'tok.json'}' does not exist; pass an existing tokenizer.json file " \
                   "or tokenizer folder, a Hub id, or tokenizer: embedded."


# ---- 83: evaluate --limit -3, --seeds -1 ----------------------------------------------------------------
@pytest.mark.parametrize("flag, values, expected", [
    ("--limit", ["-3"], "argument --limit: must be a whole number of documents (>= 1) or a fraction of each task "
                        "in (0, 1), got -3"),
    ("--limit", ["2.5"], "argument --limit: must be a whole number of documents (>= 1) or a fraction of each task "
                         "in (0, 1), got 2.5"),
    ("--seeds", ["0", "-1"], "argument --seeds: must be an integer from 0 to 2**32 - 1, got -1"),
    ("--batch_size", ["0"], "argument --batch_size: must be >= 1, got 0"),
])
def test_evaluate_refuses_a_bad_count_while_parsing(flag, values, expected, tmp_path):
    res = run_cli_here("evaluate", "--ckpt", str(tmp_path / "none.ckpt"), flag, *values, "--out", str(tmp_path / "e"))
    assert res.returncode == 2 and _line(res) == f"cli.py evaluate: error: {expected} (cli.py evaluate --help lists " \
        "every option)"  # before the checkpoint is read
    assert not (tmp_path / "e").exists()


# ---- 91: a dependency missing from this Python --------------------------------------------------------------
def test_a_missing_dependency_is_one_sentence_naming_the_python(monkeypatch):
    """The venv not activated: the command's module imports a package this Python lacks. One sentence names the
    package and the interpreter; a module of sa_lightning itself missing stays a traceback (a broken checkout)."""
    import sys

    from sa_lightning import main as entry

    def lacking(name):
        def run():
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return run

    monkeypatch.setattr(entry, "main", lacking("torch._dynamo"))
    with pytest.raises(SystemExit) as err:
        entry.main_with_clean_errors()
    assert str(err.value) == (f"error: the package 'torch' is not installed for this Python ({sys.executable}); "
                              "activate the environment sa_lightning was installed in, or install it as the README's "
                              "'Set up on a fresh machine' says.")
    monkeypatch.setattr(entry, "main", lacking("sa_lightning.nothing"))
    with pytest.raises(ModuleNotFoundError):
        entry.main_with_clean_errors()


# ---- 108: a YAML value of the wrong type -----------------------------------------------------------------
def test_a_config_value_of_the_wrong_type_names_the_file_and_the_key(tmp_path):
    """Issue 51: ``data.batch_size: four`` printed 78 lines of usage and a 10-line union dump, and never named the
    file."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  init_args:\n    batch_size: four\n")
    res = run_cli_here("fit", "--config", "configs/tiny.yaml", "--config", str(bad))
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) <= 2, res.stderr[-2000:]
    assert _line(res) == f"error: data.batch_size: expected int, got four (set in {bad})."
    flag = run_cli_here("fit", "--config", "configs/tiny.yaml", "--data.init_args.batch_size", "four")
    assert _line(flag) == "error: data.batch_size: expected int, got four (set in the flag --data.init_args.batch_size)."
    # model.* and trainer.* (jsonargparse names the whole path in one key) said "(set in the command line)" (issue 66)
    for text, key, got in (("model:\n  arch:\n    n_layer: two\n", "model.arch.n_layer", "two"),
                           ("trainer:\n  max_steps: lots\n", "trainer.max_steps", "lots")):
        bad.write_text(text)
        res = run_cli_here("fit", "--config", "configs/tiny.yaml", f"--config={bad}")
        assert _line(res) == f"error: {key}: expected int, got {got} (set in {bad})."
