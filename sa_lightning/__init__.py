"""sa_lightning: Stochastic Attention experiments with PyTorch Lightning.

Importing it changes nothing in the process: no import hook, no allocator setting, no transformers import.
A folder written by ``cli.py export`` loads with transformers' ``from_pretrained`` once
``register_with_transformers()`` has run (or with ``trust_remote_code=True``); the commands that load one
(``generate --model``, ``sweep``) register by themselves.
"""
__version__ = "0.1.0"


def register_with_transformers() -> None:
    """Registers the Transformer++ with transformers' ``AutoConfig`` (``models.hf_config``) and
    ``AutoModelForCausalLM`` (``models.hf_model``), so that ``from_pretrained`` builds the folders
    ``cli.py export`` writes. It imports transformers; calling it again does nothing more."""
    from .models.hf_config import register as register_config
    from .models.hf_model import register as register_model

    register_config()
    register_model()
