"""Input validation shared by every public kernel.

Each check raises one ``ValueError`` naming the offending argument, before any work starts.
"""
from __future__ import annotations

import operator

import torch


#: the attention backends a spec may name (``auto``: FlexAttention on CUDA, the banded kernel elsewhere)
BACKENDS = ("auto", "banded", "flex", "dense")

def as_int(value) -> int | None:
    """``value`` as a Python int when it is an integer of any kind (int, numpy integer, 0-d integer tensor);
    None for bools, floats and everything else."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_positive(name: str, value) -> int:
    number = as_int(value)
    if number is None or number < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    return number


def check_nonnegative(name: str, value) -> int:
    number = as_int(value)
    if number is None or number < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}.")
    return number


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Check the (B, Hq, n, d) / (B, Hkv, n, d) contract; return (B, Hq, Hkv, n, d)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, H, n, d), got {shape}.")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got {q.device}, {k.device} and {v.device}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype} and {v.dtype}.")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q, k and v must be floating point (float32, bfloat16, ...), got {q.dtype}.")
    B, Hq, n, d = q.shape
    if d < 1:
        raise ValueError(f"the head dim (q's last size) must be >= 1, got {d}.")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}.")
    Bk, Hkv, nk, dk = k.shape
    if Bk != B:
        raise ValueError(f"k/v batch size {Bk} does not match q's batch size {B}.")
    if nk != n:
        raise ValueError(f"k/v sequence length {nk} does not match q's length {n}.")
    if dk != d:
        raise ValueError(f"k/v head dim {dk} does not match q's head dim {d}.")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"q's head count {Hq} must be divisible by k/v's head count {Hkv} (GQA).")
    return B, Hq, Hkv, n, d


def check_perm(perm: torch.Tensor, batch: int, n: int, device: torch.device, values: bool = True) -> torch.Tensor:
    """Check a gather-index permutation of shape (n,) or (B, n): its type, shape and device, and with ``values``
    its values in O(B*n) (three host syncs; a caller that draws it, valid by construction, skips them)."""
    if not isinstance(perm, torch.Tensor):
        raise ValueError(f"perm must be a LongTensor of shape ({n},) or ({batch}, {n}), got {type(perm).__name__}.")
    if perm.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"perm must hold integers, got dtype {perm.dtype}.")
    if perm.shape not in ((n,), (batch, n)):
        raise ValueError(f"perm must have shape ({n},) or ({batch}, {n}), got {tuple(perm.shape)}.")
    if perm.device != device:
        raise ValueError(f"perm is on {perm.device} but q is on {device}.")
    perm = perm.long()
    if n == 0 or not values or torch.compiler.is_compiling():  # reading values back breaks a compiled graph;
        return perm                              # the eager call of the same code checks them
    if int(perm.min()) < 0 or int(perm.max()) >= n:
        raise ValueError(f"perm values must lie in [0, {n - 1}], got range [{int(perm.min())}, {int(perm.max())}].")
    rows = perm.reshape(-1, n)
    counts = torch.zeros_like(rows).scatter_add_(1, rows, torch.ones_like(rows))
    if not bool((counts == 1).all()):
        raise ValueError("perm must be a permutation: it has duplicate entries.")
    return perm


def default_scale(d: int, scale: float | None) -> float:
    return d ** -0.5 if scale is None else float(scale)


def check_lengths(lengths, batch: int, n: int, device: torch.device, values: bool = True) -> torch.Tensor | None:
    """Check per-row valid lengths: a LongTensor of shape (B,) with values in [1, n] (``values``: checked, one
    host sync)."""
    if lengths is None:
        return None
    if not isinstance(lengths, torch.Tensor) or lengths.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"lengths must be an integer tensor of shape ({batch},), got {lengths!r}.")
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must have shape ({batch},), got {tuple(lengths.shape)}.")
    if lengths.device != device:
        raise ValueError(f"lengths is on {lengths.device} but q is on {device}.")
    if batch and values and not torch.compiler.is_compiling() and (int(lengths.min()) < 1 or int(lengths.max()) > n):
        raise ValueError(f"lengths must lie in [1, {n}], got range [{int(lengths.min())}, {int(lengths.max())}].")
    return lengths.long()


def check_padded_perm(perm: torch.Tensor, lengths: torch.Tensor | None) -> None:
    """Check that every row's first lengths[b] slots hold its valid tokens 0 .. lengths[b] - 1.

    That is what the kernels read: row b's band wraps at slot lengths[b] and never reads a later slot, so a
    pad token in an early slot would be read and a valid token in a late slot never would. ``perm`` is an
    already checked permutation, (n,) or (B, n), and ``lengths`` checked lengths (B,); a shared (n,) perm
    must suit every row. O(B*n), a few vectorised ops and one host sync. The order of the padding among its
    own slots is free (``sample_permutation(lengths=...)`` keeps it in place).
    """
    if lengths is None or torch.compiler.is_compiling():  # values are checked by the eager call, as above
        return
    n = perm.shape[-1]
    valid = lengths.view(-1, 1)
    wrong = (perm.view(-1, n) < valid) != (torch.arange(n, device=perm.device) < valid)  # (B, n)
    if not bool(wrong.any()):
        return
    b, s = (int(i) for i in wrong.nonzero()[0])
    token = int(perm.view(-1, n)[b if perm.dim() == 2 else 0, s])
    length = int(lengths[b])
    what = (f"row {b} of perm puts padding token {token}" if perm.dim() == 2 else
            f"perm, shared by every row, puts row {b}'s padding token {token}")
    raise ValueError(
        f"{what} in slot {s}, but with lengths[{b}] = {length} the row's "
        f"valid tokens 0..{length - 1} must fill slots 0..{length - 1} and its padding must come after them; "
        f"draw perm with sample_permutation({n}, lengths=lengths).")
