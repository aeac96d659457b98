"""The variant registry: everything the project knows about an attention variant, under its name.

Each variant is one ``Variant`` object in one file of ``attention/variants/`` (``VARIANT`` there; the file is named
after the variant): its paths, its mask builder, its kernel (run on each backend it lists) and its kernel with
log-sum-exp (which makes sinks generic), its capability flags, its key counts, and how reports draw it. Every other
module asks the registry (``get_variant``, ``variant_names``) instead of naming a variant. Adding a variant is one
new file there.

The registry finds a variant's file by its name and imports that file alone, the first time the variant is asked
for: importing a variant registers nothing, and listing the names (``variant_names()``, iterating ``VARIANTS``)
imports no variant at all (``variants.ORDER`` and the folder's file names).

A variant's call (``Variant.__call__``) is its one door: it checks the inputs, draws or checks the layer's draw,
guards non-finite keys and values and adds sinks, for every variant; the kernels below it only compute. It returns
one tensor per path; the caller gates and sums the paths (see ``GatedPaths``) or, training-free, uses the single
path as is.
"""
from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
from collections.abc import MutableMapping
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import torch

from . import masks, sinks
from ._checks import BACKENDS, check_lengths, check_nonnegative, check_positive, check_qkv, default_scale
from ._finite import checking_finite, guard_nonfinite, kv_finite
from .dense import fused_masked_attention
from .flex import MIN_HEAD_DIM


#: the version of ``auto``'s kernel routes. A trained cell's spec names it (``experiments.training``): a model trained
#: under other routes differs in its rounding, so its cell trains again instead of standing for one made this way.
KERNEL_ROUTES = "2"  # 2 (2026-12-07): the CPU's fused route for short training rows (``Variant.fused_route``)


@dataclass(frozen=True)
class AttentionSpec:
    """What a layer needs to run a variant: the knobs every variant may read.

    Args:
        variant: the attention variant (the registry's name).
        window: the window w of the windowed variants (SWA's band, SA's keys per query).
        block_size: MoBA's block size.
        top_k: MoBA's blocks read per query.
        backend: the kernel route: auto (FlexAttention on CUDA where the variant has it, else banded), or one of
            the variant's own (flex, banded, dense).
        sink: attention sinks (beyond the paper): every query also reads the first ``sink`` keys of its row.
        depth: the layers the deterministic controls (strided_local, radix) tune their pattern for: where their
            fewest-layers pattern needs more, the one that reaches the most within ``depth``; null: the model's own
            number of layers (``at_depth``), or, outside a model, the fewest-layers pattern.
    """

    variant: str = "sa_swa"
    window: int = 256
    block_size: int = 64
    top_k: int = 2
    backend: str = "auto"
    #: attention sinks (beyond the paper): every query also reads the first ``sink`` keys of its row
    sink: int = 0
    #: the layers the deterministic controls tune their pattern for (keyword only: PatchSpec's positional fields
    #: follow ``sink``); None: the model's own (``at_depth``), or the fewest-layers pattern outside a model
    depth: int | None = field(default=None, kw_only=True)

    def __post_init__(self):
        variant = get_variant(self.variant)
        for name, check in (("window", check_positive), ("block_size", check_positive), ("top_k", check_positive),
                            ("sink", check_nonnegative)):
            object.__setattr__(self, name, check(name, getattr(self, name)))  # numpy and 0-d tensor ints: int
        if self.depth is not None:
            object.__setattr__(self, "depth", check_positive("depth", self.depth))
        if variant.windowed and self.window < variant.min_window:
            raise ValueError(f"{self.variant} needs a window >= {variant.min_window} (it reads SA's 2*ceil(w/2) - 2 "
                             f"other keys), got {self.window}.")
        if self.sink and not variant.takes_sink:
            raise ValueError(f"sink applies to the variants {', '.join(variant_names(takes_sink=True))}, "
                             f"not {self.variant!r}.")
        variant.check_backend(self.backend, self.sink)

    def at_depth(self, layers: int) -> "AttentionSpec":
        """This spec in a model of ``layers`` layers: its own ``depth`` where it has one, else ``layers`` (what the
        model, its export and every patched model resolve it to, so each runs the pattern it trained with)."""
        return self if self.depth is not None else replace(self, depth=check_positive("layers", layers))


@dataclass(frozen=True)
class Call:
    """One attention call, checked: what a kernel reads. ``perm`` is the layer's draw (``Variant.draw``): the
    gather index (n,) or (B, n) of the variants that permute (slot s holds token perm[s]), the random control's
    hash seeds (1 or B,); ``inv`` σ's inverse when known; ``lengths`` (B,) marks
    right padding (row b's valid tokens come first); ``backend`` is resolved (never ``auto``). ``validate``
    False: ``perm`` and ``lengths`` are valid by construction, and their values are not read back (no host
    sync; the model's layers)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    spec: AttentionSpec
    backend: str
    scale: float
    perm: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    inv: torch.Tensor | None = None
    validate: bool = True
    #: what the kernel would otherwise choose from q and k itself (MoBA's blocks), fixed from the inputs as given
    #: when their keys or values are non-finite, so that the non-finite guard's runs all read the same choice
    selection: torch.Tensor | None = None

    @property
    def window(self) -> int:
        return self.spec.window

    @property
    def pos(self) -> torch.Tensor | None:
        """``perm`` as a (1 or B, n) table."""
        return None if self.perm is None else (self.perm if self.perm.dim() == 2 else self.perm.unsqueeze(0))


#: kernel(call) -> one output per path
Kernel = Callable[[Call], tuple]
#: kernel_with_lse(call) -> (output, log-sum-exp (B, Hq, n)) of a single-path variant
LseKernel = Callable[[Call], tuple]
#: mask(spec, n, perm, lengths) -> the variant's mask function in original positions
MaskBuilder = Callable[[AttentionSpec, int, "torch.Tensor | None", "torch.Tensor | None"], masks.MaskMod]
#: attended(spec, length, pos_row) -> keys the mask allows over one row of ``length`` valid tokens
KeyCount = Callable[[AttentionSpec, int, "torch.Tensor | None"], int]
#: computed(spec, n) -> keys per query that the kernel computes at length n, paths summed
KeyCost = Callable[[AttentionSpec, int], float]
#: draw(spec, n, lengths, generator or [generator per row], device) -> the layer's draw
Drawer = Callable[..., torch.Tensor]
#: check_draw(draw, batch, n, device, lengths, values=True) -> the draw, checked (values included unless ``values``
#: is False)
DrawCheck = Callable[..., torch.Tensor]
#: slot_order(spec, perm) -> the layer order (``attention.slots.SlotOrder``) of a variant that permutes
SlotOrderer = Callable[..., "object"]
#: oracle_mask(spec, q, k, perm, lengths) -> the float64 oracle's own bool mask, (1 or B, 1 or Hq, n, n), built by
#: ``attention.oracle`` independently of the kernels and of ``mask`` (the tests' single source of truth)
OracleMask = Callable[..., torch.Tensor]


def _output_of(kernel_with_lse: LseKernel, call: Call) -> tuple[torch.Tensor]:
    """A single-path variant's kernel from its kernel with log-sum-exp: the output alone."""
    return (kernel_with_lse(call)[0],)


@dataclass(frozen=True)
class Variant:
    """One attention variant, whole."""

    name: str
    #: how tables and figures name and draw it
    label: str
    color: str
    marker: str
    #: one output per path; a variant with several is gated by its trained model (``gated``)
    paths: tuple[str, ...]
    #: None: its single path's output from ``kernel_with_lse`` (the log-sum-exp dropped)
    kernel: Kernel | None = field(default=None, repr=False)
    keys_attended_row: KeyCount = field(default=None, repr=False)
    keys_computed_at: KeyCost = field(default=None, repr=False)
    #: the backends its kernel honours besides ``auto``
    backends: tuple[str, ...] = ("banded", "dense")
    #: its single path with log-sum-exp, on checked arguments (None: it takes no sinks)
    kernel_with_lse: LseKernel | None = field(default=None, repr=False)
    mask: MaskBuilder | None = field(default=None, repr=False)
    #: one oracle mask per path (a gated variant's paths are variants: the registry has theirs)
    oracle_mask: OracleMask | None = field(default=None, repr=False)
    #: draw(spec, n, lengths, generator, device) -> the tensor it draws per layer (σ's gather index, the random
    #: control's hash seeds), from one generator for the batch or a list of one per row; None: it draws nothing.
    #: Callers go through ``attention.draws.layer_draws``, never this directly.
    draw: Drawer | None = field(default=None, repr=False)
    #: check_draw(draw, batch, n, device, lengths, values=True) -> a caller's draw, checked (its values too unless
    #: ``values`` is False: a caller whose draw is valid by construction)
    check_draw: DrawCheck | None = field(default=None, repr=False)
    #: select(call) -> the choice its kernel makes from the data (``Call.selection``), made once from the inputs as
    #: given where their keys or values are non-finite; None: its kernel reads nothing from the data
    select: Callable[[Call], torch.Tensor] | None = field(default=None, repr=False)
    #: the dims of one row's draw: 1 for σ (n,), 0 for a hash seed; a batch adds one in front
    draw_ndim: int = 1
    #: its draw is a permutation, and its paths read slots (σ's band)
    uses_permutation: bool = False
    #: (a variant that permutes) its far path is SA's circular band over the slots, the pattern the analyses'
    #: "theory" convention shuffles; False: another slot pattern (bucketed SA's buckets), read from its own mask
    circular: bool = True
    #: False for full attention, which reads every earlier key (a patched model keeps its own kernel for it)
    sparse: bool = True
    #: reads ``spec.window``
    windowed: bool = False
    #: reads ``spec.block_size`` and ``spec.top_k``
    blocked: bool = False
    #: its paths' outputs are mixed by output gates only a model trained with them has (not training-free)
    gated: bool = False
    #: a gated variant's training-free counterpart (one softmax over the paths' masks), for a pretrained model
    training_free_twin: str | None = None
    #: its FlexAttention masks capture only tensors that come into a compiled model (the draws), so Inductor's CPU
    #: template builds them inside the model's graph; False where a mask captures a table the graph computes
    #: (MoBA's picks), which that template cannot take (torch 2.13): a compiled model on the CPU then runs the
    #: kernel eagerly between its graphs
    cpu_graph: bool = True
    #: the paths that read only the last ``window`` keys, so decoding may keep only that much cache
    local_paths: tuple[str, ...] = ()
    #: its draw is made once per layer from the run's seed and kept for the whole of training and evaluation (fixed-σ
    #: SA: against SA it asks whether drawing σ afresh matters); ``permutation: deterministic`` does the same to any
    #: variant that draws
    frozen: bool = False
    #: A layer run in slot order (``attention.slots``: the model permutes the layer's rows once, not q, k, v and
    #: the output): ``slot_order(spec, perm)`` -> its ``SlotOrder``, and ``slot_kernel(call)`` -> the output in
    #: slot order for q, k, v already in it (``call.perm``: each slot's original position). None: the kernel
    #: reorders by itself.
    slot_order: SlotOrderer | None = field(default=None, repr=False)
    slot_kernel: Callable[[Call], torch.Tensor] | None = field(default=None, repr=False)
    #: the backends ``slot_kernel`` runs on, and whether it takes right-padded rows (``lengths``)
    slot_backends: tuple[str, ...] = ()
    slot_padding: bool = False
    #: the smallest window it is defined at (the controls read 2 * ceil(w/2) - 2 >= 1 other keys: w >= 3), checked
    #: where a spec is made, before any cell or step runs
    min_window: int = 1
    #: the CPU's training route at short rows (``fused_route``): below ``fused_below`` x its keys computed per query,
    #: its mask in original positions runs as an n x n bool mask through PyTorch's fused SDPA instead of its own
    #: kernel; None: never. Measured forward and backward, one thread, w = 16, batch 32, 2 heads of 32
    #: (docs/benchmarks/training.md, "A seed at its compute floor"): the band kernels win from about 12 x their keys
    #: (SA at n = 128: 7.9 ms fused against 16.1 banded; n = 256: 25.2 against 24.4)
    fused_below: float | None = 12.0
    #: the version of its semantics: raised where what it computes for the same spec changes (2: the deterministic
    #: controls' patterns tuned for the model's depth, issue 76), so a trained cell made under another is trained
    #: again (``experiments.training``), not reused
    revision: int = 1
    #: slot_mask(spec, slots) -> its mask from each token's slot (σ's inverse, (1 or B, n)), where a caller gave the
    #: inverse with σ (``Call.inv``: a benchmark precomputes both), so the fused route inverts nothing; None: ``mask``
    slot_mask: Callable[..., masks.MaskMod] | None = field(default=None, repr=False)
    description: str = ""
    #: a figure's panel title (the label when empty)
    title: str = ""

    def __post_init__(self):
        object.__setattr__(self, "title", self.title or self.label)
        if self.keys_attended_row is None or self.keys_computed_at is None:
            raise TypeError(f"variant {self.name!r} needs keys_attended_row and keys_computed_at.")
        if self.kernel is None:
            if self.kernel_with_lse is None:
                raise TypeError(f"variant {self.name!r} needs a kernel or a kernel_with_lse.")
            # named as its kernel_with_lse, so that a traceback names the variant's own function
            object.__setattr__(self, "kernel", functools.update_wrapper(
                functools.partial(_output_of, self.kernel_with_lse), self.kernel_with_lse))

    @property
    def draws(self) -> bool:
        """It draws a random tensor per layer (per training step, or per input in evaluation)."""
        return self.draw is not None

    def draw_row(self, draw: torch.Tensor | None, b: int) -> torch.Tensor | None:
        """Row b's draw from a shared (unbatched) or per-row one."""
        if draw is None:
            return None
        return draw[b if draw.shape[0] > 1 else 0] if draw.dim() > self.draw_ndim else draw

    @property
    def takes_sink(self) -> bool:
        return self.kernel_with_lse is not None

    def check_backend(self, backend: str, sink: int = 0) -> None:
        """Refuse, in one sentence, a backend this variant would not honour."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}.")
        offered = ("banded",) if sink else self.backends  # sinks merge into the O(n*w) kernel's log-sum-exp
        if backend != "auto" and backend not in offered:
            extra = " with sinks" if sink and backend in self.backends else ""
            raise ValueError(f"variant {self.name!r}{extra} runs on the backends {', '.join(offered)} (or auto), "
                             f"not {backend!r}.")

    def resolve_backend(self, backend: str, q: torch.Tensor, sink: int = 0) -> str:
        small = q.shape[-1] < MIN_HEAD_DIM
        if backend != "auto":
            if backend == "flex" and q.is_cuda and small:
                raise ValueError(f"FlexAttention on CUDA needs a head dim of at least {MIN_HEAD_DIM}, got "
                                 f"{q.shape[-1]}: use backend banded (or auto, which picks it).")
            return backend
        return "flex" if q.is_cuda and "flex" in self.backends and not sink and not small else "banded"

    def traceable(self, spec: AttentionSpec, q: torch.Tensor, lengths: torch.Tensor | None = None) -> bool:
        """Its kernel can run inside a ``torch.compile`` graph for this call: FlexAttention (a compiler op) on
        rows without padding or sinks (on the CPU, where ``cpu_graph``). Every other path holds custom autograd
        functions or reads a ragged length, so a compiled model runs it eagerly between its graphs."""
        return (lengths is None and self.resolve_backend(spec.backend, q, spec.sink) == "flex"
                and (q.is_cuda or self.cpu_graph))

    def __call__(self, q, k, v, spec: AttentionSpec, perm: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None, inv: torch.Tensor | None = None, *,
                 validate: bool = True, scale: float | None = None, generator: torch.Generator | None = None,
                 return_lse: bool = False) -> tuple:
        """One output per path for q (B, Hq, n, d), k, v (B, Hkv, n, d); ``perm`` etc. as ``Call``'s.

        The variant's one door: every variant's inputs are checked here (shapes, ``lengths``, and the draw, with
        their values unless ``validate`` is False), the draw is made from ``generator`` where the caller gave none,
        non-finite keys and values are kept out of the rows that cannot see them (``_finite``'s debug mode), and
        ``spec.sink`` sink keys are added. ``scale`` defaults to 1/sqrt(d). ``return_lse`` (a variant that takes
        sinks): (output, log-sum-exp (B, Hq, n)) of its single path instead."""
        B, _, _, n, d = check_qkv(q, k, v)
        lengths = check_lengths(lengths, B, n, q.device, values=validate)
        perm = self.checked_draw(spec, perm, generator, B, n, q.device, lengths, validate)
        call = Call(q, k, v, spec, self.resolve_backend(spec.backend, q, spec.sink), default_scale(d, scale),
                    perm, lengths, inv, validate)
        if spec.sink or return_lse:
            if not self.takes_sink:
                raise ValueError(f"variant {self.name!r} has no kernel with log-sum-exp: it takes no sinks and "
                                 "returns no log-sum-exp.")
            out = self._guarded(lambda call: sinks.attend_with_sinks(self, call), call)
            return out if return_lse else out[:1]
        return self._guarded(self._fused if self.fused_route(call) else self.kernel, call)

    def fused_route(self, call: Call) -> bool:
        """Whether ``call`` runs as its n x n mask through PyTorch's fused SDPA (``_fused``): ``auto`` on the
        CPU, in a training step (q needs a gradient) on rows without padding, a single-path variant whose mask
        reads nothing from the data, and n under ``fused_below`` x its keys computed per query. There every row
        reads at least its own key, so no row of the mask is empty; evaluation and training-free inference keep
        the variant's own kernel. Exact to rounding (the tests hold both to the oracle)."""
        if (self.fused_below is None or self.mask is None or self.select is not None or len(self.paths) != 1
                or call.spec.backend != "auto" or call.q.device.type != "cpu" or call.lengths is not None
                or not (torch.is_grad_enabled() and call.q.requires_grad)):
            return False
        n = call.q.shape[2]
        return n < self.fused_below * self.keys_computed(call.spec, n)

    def _fused(self, call: Call) -> tuple:
        """The variant's output through its n x n mask and PyTorch's fused SDPA (``fused_route``)."""
        n, draw = call.q.shape[2], call.perm
        per_row = draw is not None and draw.dim() > self.draw_ndim and draw.shape[0] > 1
        if self.slot_mask is not None and call.inv is not None:  # σ's inverse given: the mask from it, not inverted
            mod = self.slot_mask(call.spec, call.inv if call.inv.dim() == 2 else call.inv.unsqueeze(0))
        else:
            mod = self.mask(call.spec, n, draw, None)
        mask = masks.dense(mod, n, batch=call.q.shape[0] if per_row else 1,
                           device=call.q.device)  # a draw the batch shares: one mask, broadcast
        return (fused_masked_attention(call.q, call.k, call.v, mask, scale=call.scale),)

    def checked_draw(self, spec: AttentionSpec, draw, generator, batch: int, n: int, device,
                     lengths: torch.Tensor | None = None, validate: bool = True):
        """The layer's draw for a call: the caller's, checked (its values too with ``validate``), or one drawn from
        ``generator`` (σ: shared by the batch, or one per row that keeps its padding in place with ``lengths``).
        A variant that draws nothing passes ``draw`` through unread."""
        if self.draw is None:
            return draw
        if draw is None:
            return self.draw(spec, n, lengths, generator, device)
        return self.check_draw(draw, batch, n, device, lengths, values=validate)

    def check_inputs(self, draws, lengths, batch: int, n: int, device):
        """(draws, lengths) checked once at a model's public boundary (values included: host syncs), so that its
        layers can call the variant with ``validate=False``. ``draws`` holds one draw per layer (None for a layer
        that draws nothing), each checked by the variant's ``check_draw``; ``draws`` itself may be None."""
        lengths = check_lengths(lengths, batch, n, device)
        if draws is not None and self.check_draw is not None:
            draws = [d if d is None else self.check_draw(d, batch, n, device, lengths) for d in draws]
        return draws, lengths

    def _guarded(self, run: Callable[[Call], tuple], call: Call):
        """``run(call)``, its rows kept from the non-finite keys and values they cannot see (``guard_nonfinite``;
        only in the debug mode, and never inside ``torch.compile``)."""
        if not checking_finite() or torch.compiler.is_compiling() or kv_finite(call.k, call.v):
            return run(call)
        if self.select is not None:  # the guard's runs on cleaned keys must read the blocks the raw ones pick
            call = replace(call, selection=self.select(call))
        return guard_nonfinite(lambda q, k, v: run(replace(call, q=q, k=k, v=v)), call.q, call.k, call.v,
                               finite=False)

    def runs_in_slots(self, spec: AttentionSpec, x: torch.Tensor, head_dim: int,
                      lengths: torch.Tensor | None = None) -> bool:
        """Whether a model should run this layer in slot order (``in_slots``) for input rows ``x`` on ``spec``'s
        backend: a slot kernel for that backend, no sinks, and no padding unless the kernel takes it."""
        if self.slot_kernel is None or spec.sink or (lengths is not None and not self.slot_padding):
            return False
        return self.resolve_backend(spec.backend, x.new_empty(0, 0, 0, head_dim)) in self.slot_backends

    def in_slots(self, q, k, v, spec: AttentionSpec, order, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The output in slot order for q (B, Hq, m, d), k, v (B, Hkv, m, d) already in ``order``'s slots
        (``attention.slots``), through the same checks and non-finite guard as a call in token order."""
        _, _, _, _, d = check_qkv(q, k, v)
        call = Call(q, k, v, spec, self.resolve_backend(spec.backend, q), default_scale(d, None), order.pos, lengths,
                    None, False)
        return self._guarded(self.slot_kernel, call)

    def oracle_masks(self, spec, q, k, perm=None, lengths=None) -> list[torch.Tensor]:
        """The float64 oracle's mask of each path, in path order."""
        if self.oracle_mask is not None:
            return [self.oracle_mask(spec, q, k, perm, lengths)]
        return [m for p in self.paths for m in get_variant(p).oracle_masks(spec, q, k, perm, lengths)]

    def effective_window(self, spec) -> int | None:
        """w_eff, the x-axis of the sweeps: the window, MoBA's block_size * top_k, or None (full attention)."""
        if self.blocked:
            return spec.block_size * spec.top_k
        return spec.window if self.windowed else None

    def keys_attended(self, spec: AttentionSpec, n: int, *, perm: torch.Tensor | None = None,
                      lengths: torch.Tensor | None = None, batch: int = 1) -> tuple[int, int]:
        """(keys its mask allows, valid queries) over a (batch, n) input, sinks included (``sinks.keys_attended``)."""
        return sinks.keys_attended(self, spec, n, perm=perm, lengths=lengths, batch=batch)

    def keys_computed(self, spec: AttentionSpec, n: int) -> float:
        """Keys per query that the kernel computes at length n, paths summed (what FLOPs count)."""
        return float(self.keys_computed_at(spec, n))

    def __str__(self) -> str:
        return self.name


_VARIANTS_PACKAGE = __name__.rpartition(".")[0] + ".variants"


def _built_in_names() -> tuple[str, ...]:
    """The variants' files in ``attention/variants/``, by name, without importing one: ``variants.ORDER`` first
    (the order tables list them in), then any other file there (not ``_``-prefixed, a helper) by name."""
    package = importlib.import_module(_VARIANTS_PACKAGE)  # the folder's index: it imports no variant
    files = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
    return tuple(package.ORDER) + tuple(name for name in files if name not in package.ORDER)


class Registry(MutableMapping):
    """Name -> ``Variant``: the built-in variants (one file each in ``attention/variants/``, imported only when
    first asked for) and the ones a caller registered (``register_variant``). Listing the names imports nothing."""

    def __init__(self):
        self._built_in: tuple[str, ...] | None = None
        self._loaded: dict[str, Variant] = {}
        self._added: dict[str, Variant] = {}

    @property
    def added(self) -> tuple[str, ...]:
        """The names callers registered in this process (``register_variant``)."""
        return tuple(self._added)

    @property
    def built_in(self) -> tuple[str, ...]:
        if self._built_in is None:
            self._built_in = _built_in_names()
        return self._built_in

    def _load(self, name: str) -> Variant:
        variant = self._loaded.get(name)
        if variant is None:
            module = importlib.import_module(f"{_VARIANTS_PACKAGE}.{name}")
            variant = getattr(module, "VARIANT", None)
            if not isinstance(variant, Variant) or variant.name != name:
                raise ValueError(f"attention/variants/{name}.py must define VARIANT, a Variant named {name!r}.")
            variant = self._loaded.setdefault(name, variant)
        return variant

    def __getitem__(self, name: str) -> Variant:
        if name in self._added:
            return self._added[name]
        if isinstance(name, str) and name in self.built_in:
            return self._load(name)
        raise KeyError(name)

    def __setitem__(self, name: str, variant: Variant) -> None:
        if name in self.built_in and self._load(name) is not variant:
            raise ValueError(f"{name!r} is a built-in variant (attention/variants/{name}.py); register yours under "
                             "another name.")
        if name in self._added and self._added[name] is not variant:
            raise ValueError(f"a variant {name!r} is registered already; register yours under another name, or "
                             f"remove the first (del VARIANTS[{name!r}]) before it replaces it.")
        self._added[name] = variant

    def __delitem__(self, name: str) -> None:
        if name in self.built_in:
            raise ValueError(f"{name!r} is a built-in variant (attention/variants/{name}.py); it cannot be removed.")
        del self._added[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.built_in
        yield from self._added

    def __len__(self) -> int:
        return len(self.built_in) + len(self._added)

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and (name in self._added or name in self.built_in)

    def add(self, variant: Variant) -> Variant:
        """``variant`` under its name; a name already taken by another object is refused."""
        taken = self.get(variant.name)
        if taken is not None and taken is not variant:
            raise ValueError(f"variant name {variant.name!r} is taken ({taken.description or taken.label}); "
                             "register yours under another name.")
        if variant.name not in self.built_in:
            self._added[variant.name] = variant
        return variant


VARIANTS = Registry()


def register_variant(variant: Variant) -> Variant:
    """Add ``variant`` under its name; a name already taken is refused (a second file registering "sa" would
    replace SA everywhere without a word). The built-in variants need no registering: the registry finds their
    files by name."""
    return VARIANTS.add(variant)


def get_variant(name: str | Variant) -> Variant:
    if isinstance(name, Variant):
        return name
    try:
        return VARIANTS[name]
    except (KeyError, TypeError):
        close = difflib.get_close_matches(str(name), VARIANTS, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown attention variant {name!r}; choose one of {', '.join(VARIANTS)}.{hint}") from None


def variant_names(**flags) -> tuple[str, ...]:
    """The registered names, in the tables' order (the built-in ones, then those registered), whose attributes
    equal ``flags`` (``variant_names(gated=False)``: the training-free ones). Without flags it imports no variant."""
    if not flags:
        return tuple(VARIANTS)
    return tuple(name for name, v in VARIANTS.items() if all(getattr(v, k) == want for k, want in flags.items()))


def sigma_seeds(name: str | Variant, seeds) -> list[int]:
    """The σ seeds a model with variant ``name`` is scored under: all of ``seeds`` where its attention draws (σ, hash
    seeds), the first alone where it draws nothing or its draw is frozen (every seed would score it the same)."""
    seeds = list(seeds)
    variant = get_variant(name)
    return seeds if variant.draws and not variant.frozen else seeds[:1]


def trained_variant_names() -> tuple[str, ...]:
    """The variants a model is pre-trained with: every one but the training-free twins of gated ones."""
    twins = {v.training_free_twin for v in VARIANTS.values()}
    return tuple(name for name in VARIANTS if name not in twins)


def variant_label(name: str, window: int | None = None, block_size: int | None = None, top_k: int | None = None,
                  sink: int = 0) -> str:
    """``SA``, ``SWA+sink4``, ``SA+SWA (w=32)``, ``MoBA (c=64, k=2)``, ``Full``: a variant's name in a table or
    legend, with its window (windowed variants) or block and top-k (blocked ones) when given. A name the
    registry lacks (a benchmark's own) is written out in capitals."""
    variant = VARIANTS.get(name)
    label = variant.label if variant else name.replace("_", "+").upper()
    if sink:
        label += f"+sink{sink}"
    if variant and variant.windowed and window is not None:
        label += f" (w={window})"
    elif variant and variant.blocked and block_size is not None and top_k is not None:
        label += f" (c={block_size}, k={top_k})"
    return label

