"""Keeping non-finite keys and values out of the rows that cannot see them.

A masked key's weight is an exact 0, but 0 * NaN and 0 * inf in ``p @ v`` are NaN, and a mask that is
added to the scores (SDPA's and FlexAttention's, and the banded training kernel's finite bias, kept
there because it is branch-free) leaves a NaN score NaN. So every public kernel runs through
:func:`guard_nonfinite`. The contract: an output row that cannot see a token (its mask excludes that
key) is exactly what it would be were that token's key and value any finite numbers; a row that sees a
non-finite key or value gives what the raw computation gives (NaN or inf, as a rule); a non-finite
query only ever touches its own row. Outputs at padding tokens keep their own contract: finite, but
meaningless, for finite inputs.

The guard is a **debug mode**, off by default: checking the inputs reads a value back to the host (a GPU sync
per kernel call, one per layer per step), and a training run whose keys are non-finite has diverged anyway.
Turn it on with ``with check_finite(): ...`` or ``SA_LIGHTNING_CHECK_FINITE=1`` when a NaN must be traced to
the rows that see it; off, every kernel runs straight through.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator, Tuple, Union

import torch

_CHECKING = [os.environ.get("SA_LIGHTNING_CHECK_FINITE", "") not in ("", "0")]


def checking_finite() -> bool:
    """Whether the non-finite guard is on (``check_finite``)."""
    return _CHECKING[0]


@contextlib.contextmanager
def check_finite(enabled: bool = True) -> Iterator[None]:
    """``with check_finite(): ...`` runs every kernel inside with the non-finite guard (the debug mode)."""
    before, _CHECKING[0] = _CHECKING[0], enabled
    try:
        yield
    finally:
        _CHECKING[0] = before

#: what a kernel returns: an output, or a tuple of outputs each optionally followed by its log-sum-exp
Outputs = Union[torch.Tensor, Tuple[torch.Tensor, ...]]


def kv_finite(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether every key and value is finite: one sum per tensor, no temporary the size of k.

    A sum is non-finite whenever any term is (inf + -inf is NaN), so nothing non-finite slips through;
    an overflowing sum of finite values only sends the call down the (exact, slower) guarded path. It
    costs about 1% of an SA forward at n=2048, w=64 on CPU, where ``isfinite(k).all()`` would cost a
    third of the forward itself. On a GPU the ``bool`` is a host sync: a non-finite input has to change what
    runs. That is why the guard is a debug mode.
    """
    acc = torch.float32 if k.dtype == torch.float16 else k.dtype  # fp16's range would overflow; bf16 has fp32's
    return bool(torch.isfinite(k.sum(dtype=acc) + v.sum(dtype=acc)))


def guard_nonfinite(run: Callable[..., Outputs], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    finite: bool | None = None) -> Outputs:
    """``run(q, k, v)``, with non-finite keys and values kept out of the rows that cannot see them.

    ``run`` returns an output (B, Hq, n, d) or a tuple of them, each optionally followed by its
    log-sum-exp (B, Hq, n). If k and v are finite (the normal case, ``finite`` when the caller already
    knows) it is simply called. Otherwise it runs three times: on k and v with their non-finite entries
    set to 0 (the result of every row that cannot see one); with the values replaced by an indicator of
    the bad tokens (a row's output is nonzero exactly where it gives such a token a nonzero weight: masked
    weights are exact zeros); and on the raw inputs, whose result the rows that see a bad token keep.
    Gradients flow through the first run only, so they stay finite where the inputs are.

    Off unless the debug mode is on (``check_finite``), and always inside ``torch.compile``, where its branch on
    the data would break the graph in every layer.
    """
    if not _CHECKING[0] or torch.compiler.is_compiling():
        return run(q, k, v)
    if finite if finite is not None else kv_finite(k, v):
        return run(q, k, v)
    ok_k, ok_v = torch.isfinite(k), torch.isfinite(v)
    clean = run(q, torch.where(ok_k, k, 0), torch.where(ok_v, v, 0))
    with torch.no_grad():
        k0 = torch.where(ok_k, k, 0)
        bad = ~(ok_k.all(-1, keepdim=True) & ok_v.all(-1, keepdim=True))  # (B, Hkv, n, 1)
        # a large indicator so that a small weight in a half dtype does not round to zero
        mark = bad.to(v.dtype).mul_(torch.finfo(v.dtype).max / 4).expand_as(v).contiguous()
        seen = run(q.detach(), k0, mark)
        raw = run(q.detach(), k.detach(), v.detach())
    single = isinstance(clean, torch.Tensor)
    clean, seen, raw = ((x,) if single else tuple(x) for x in (clean, seen, raw))
    out, sees = [], None
    for c, s, r in zip(clean, seen, raw):
        if c.dim() == 4:  # an output: a row sees a bad token where its indicator output is not 0 (or NaN)
            sees = (s != 0).any(-1, keepdim=True)
            out.append(torch.where(sees, r, c))
        else:  # the log-sum-exp of the output before it
            out.append(torch.where(sees.squeeze(-1), r, c))
    return out[0] if single else tuple(out)
