"""One file per attention variant, named after it, each defining ``VARIANT``; ``_``-prefixed files are helpers.

Importing this package imports no variant, and importing a variant registers nothing: the registry
(``attention.registry``) finds a variant's file by its name and imports that file alone, the first time the
variant is asked for. ``ORDER`` is the order tables list the variants in; a file here that it does not name
follows them, by name. A new variant is a new file here (and its place in ``ORDER``).

The objects are importable by name (``variants.SWA``, the file's ``VARIANT``) for code that means one variant in
particular (the paper's comparisons: SA against SWA at equal w); such code writes ``SWA.name``, never the string.
Each such name imports its own file only.
"""
import importlib

ORDER = ("full", "swa", "sa",
         "sa_fixed",  # fixed-σ SA
         "sa_swa", "moba", "sa_swa_union",
         "strided", "strided_swa_union", "strided_swa",  # the controls
         "strided_local", "strided_local_swa_union", "strided_local_swa",  # the deterministic control that reaches
         "radix",  # the deterministic control that reaches in the fewest layers SA's budget allows
         "random", "random_swa_union", "random_swa",
         "sa_bucket", "sa_bucket_swa_union", "sa_bucket_swa")  # bucketed SA

__all__ = [name.upper() for name in ORDER]


def __getattr__(attr: str):
    """``variants.SA``: the ``VARIANT`` of ``variants/sa.py``, that file imported alone."""
    if attr.isupper() and attr.lower() in ORDER:
        return importlib.import_module(f"{__name__}.{attr.lower()}").VARIANT
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
