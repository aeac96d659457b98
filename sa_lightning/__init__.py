"""sa_lightning: Stochastic Attention experiments with PyTorch Lightning.

Importing it registers the Transformer++ with transformers' ``AutoConfig`` (``models.hf_config``) and
``AutoModelForCausalLM`` (``models.hf_model``), so that a folder written by ``cli.py export`` loads with
``from_pretrained``. Each registration waits until transformers' auto module it extends has been imported
(it runs at once if it already was): importing ``sa_lightning`` alone never imports transformers.
"""
import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

#: transformers' auto module -> the sa_lightning module whose ``register()`` extends it
_AUTO = {"transformers.models.auto.configuration_auto": "sa_lightning.models.hf_config",
         "transformers.models.auto.modeling_auto": "sa_lightning.models.hf_model"}


def _register(auto: str) -> None:
    importlib.import_module(_AUTO[auto]).register()


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``_register`` right after one of transformers' auto modules has been executed."""

    def find_spec(self, name, path=None, target=None):
        if name not in _AUTO:
            return None
        sys.meta_path.remove(self)  # the real spec, from the finders after this one
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _register(name)

        spec.loader.exec_module = exec_module
        return spec


for _auto in _AUTO:
    if _auto in sys.modules:
        _register(_auto)
if not all(name in sys.modules for name in _AUTO) and \
        not any(type(f).__name__ == "_RegisterAfterImport" for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterImport())
