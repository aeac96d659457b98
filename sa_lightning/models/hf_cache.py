"""The name transformers gives the KV cache, on either side of its rename.

transformers 5.24 renamed the cache that ``generate`` hands to ``forward``, and the output field it reads back,
from ``past_key_values`` to ``cache``. The old name still works there but warns, and Qwen3 and Llama drop it in
5.40. Code that hands a cache to a transformers model, or reads one from its output, uses ``CACHE`` and
``cache_of`` so that it runs on the installed version, old or new, without a warning.
"""
from __future__ import annotations

import dataclasses

from transformers.modeling_outputs import CausalLMOutputWithPast

#: the keyword this transformers install passes the cache by, and the output field that holds it
CACHE = "cache" if "cache" in {f.name for f in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"


def cache_of(output):
    """The KV cache a transformers model returned in ``output`` (None without one)."""
    return getattr(output, CACHE, None)
