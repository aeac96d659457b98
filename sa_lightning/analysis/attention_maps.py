"""Attention heat maps per variant, as in the paper's Figure 3 (Layer 11, Head 0, 27 tokens, w=8).

The model runs with its own variant up to the chosen layer; that layer's queries and keys are then
scored under each variant's mask from the registry (gray: masked, blue: weight). The SA masks use the
permutation the model itself draws at that layer. For SA+SWA the panel shows the two paths as the
paper's Figure 3 does, "with the learned gate adaptively balancing the two": each query's row is
(g_sa * A_sa + g_swa * A_swa) / (g_sa + g_swa), where g_p is that query's gate activation
sigmoid(W_p Y_p), averaged over the head's channels, read from the checkpoint's own SA+SWA layer. (The
gates mix features, not weights, so this is the closest single map; a model without the two gates,
such as a single-path one, gets the plain mean and its title says so.)

    python cli.py analyze attention-maps --ckpt runs/tiny/tb/version_0/checkpoints/last.ckpt
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..attention import AttentionSpec, get_variant, layer_generator, masks, sample_permutation
from ..attention.oracle import moba_mask
from ..attention.variants import FULL, SA, SA_SWA, SWA
from ..models.transformer import Transformer
from ..utils.atomic import output_folder
from ..utils.report import pyplot, save_figure
from ..utils.argtypes import doc_help



#: the paper's Figure 3
FIGURE_3 = tuple(v.name for v in (FULL, SWA, SA, SA_SWA))


class _Stop(Exception):
    pass


def _inputs_of(module: torch.nn.Module, model: Transformer, idx: torch.Tensor) -> tuple:
    """The positional inputs ``module`` receives when ``model`` runs ``idx`` with its own permutations
    (stream 0); the forward stops there."""
    captured = {}

    def grab(_, args):
        captured["args"] = args
        raise _Stop

    handle = module.register_forward_pre_hook(grab)
    try:
        with torch.no_grad():
            model.features(idx, perms=model.draws(idx.shape[1], 0, idx.device), compiled=False)  # hooks run eagerly
    except _Stop:
        pass
    finally:
        handle.remove()
    return captured["args"]


def layer_qk(model: Transformer, idx: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries (1, Hq, n, hd) and keys (1, Hkv, n, hd) of ``layer``, RoPE applied, for one sequence: the layer's
    own ``Attention.heads`` on the input its forward saw (no copy of the projection)."""
    attn = model.blocks[layer].attn
    x, cos, sin = _inputs_of(attn, model, idx)[:3]
    with torch.no_grad():
        q, k, _ = attn.heads(x, cos, sin)
    return q, k


def layer_gates(model: Transformer, idx: torch.Tensor, layer: int, head: int) -> dict[str, torch.Tensor] | None:
    """Per path, each query's gate activation sigmoid(W_p Y_p) averaged over ``head``'s channels, (n,),
    for a model whose ``layer`` has the two gates of SA+SWA; None otherwise."""
    attn = model.blocks[layer].attn
    gate = attn.gate
    if len(gate.paths) < 2:
        return None
    paths = _inputs_of(gate, model, idx)
    channels = slice(head * attn.head_dim, (head + 1) * attn.head_dim)
    with torch.no_grad():
        return {p: torch.sigmoid(gate.gates[p](y))[0, :, channels].mean(-1).double().cpu()
                for p, y in zip(gate.paths, paths)}


def _weights(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)


def variant_maps(q: torch.Tensor, k: torch.Tensor, head: int, variants: list[str], window: int,
                 block_size: int = 4, top_k: int = 2, seed: int = 0, layer: int = 0,
                 perm: torch.Tensor | None = None, gates: dict[str, torch.Tensor] | None = None) -> dict[str, tuple]:
    """{variant: (weights (n, n), visible (n, n) bool)} for one head, in float64. ``perm``: the SA
    permutation (default: one drawn from ``seed`` and ``layer``); ``gates``: see ``layer_gates``."""
    n, hd = q.shape[2], q.shape[3]
    group = q.shape[1] // k.shape[1]
    qh, kh = q[0, head].double(), k[0, head // group].double()
    scores = qh @ kh.T / hd ** 0.5
    if perm is None:
        perm = sample_permutation(n, generator=layer_generator(seed, layer))
    perm = perm.cpu()
    out = {}
    for name in variants:
        variant = get_variant(name)
        spec = AttentionSpec(variant=name, window=window, block_size=block_size, top_k=top_k)
        if variant.mask is None:  # picked by content (MoBA): the oracle's selection for this head
            visible = moba_mask(q[:, head:head + 1], k[:, head // group:head // group + 1], block_size, top_k)[0, 0]
            out[name] = (_weights(scores, visible), visible)
        elif len(variant.paths) > 1:  # each path's weights (a path is a variant), balanced by the learned gates
            ones = torch.ones(n, dtype=torch.float64)
            seen = [masks.dense(get_variant(p).mask(spec, n, perm), n)[0, 0] for p in variant.paths]
            # the model's learned gates weigh the panel of its own paths (an SA+SWA panel of a Random+SWA model: equal)
            mine = gates is not None and set(gates) == set(variant.paths)
            weight = [gates[p] if mine else ones for p in variant.paths]
            mixed = sum(g[:, None] * _weights(scores, m) for g, m in zip(weight, seen))
            out[name] = (mixed / sum(weight)[:, None], torch.stack(seen).any(0))
        else:
            visible = masks.dense(variant.mask(spec, n, perm), n)[0, 0]
            out[name] = (_weights(scores, visible), visible)
    return out


def draw(maps: dict[str, tuple], labels: list[str], title: str):
    """A row of heat maps: masked cells gray, weights in blue. Returns the matplotlib figure."""
    import numpy as np

    plt = pyplot()

    cmap = plt.get_cmap("Blues").with_extremes(bad="#BDBDBD")  # masked cells gray
    fig, axes = plt.subplots(1, len(maps), figsize=(3.6 * len(maps), 3.9), squeeze=False)
    n = len(labels)
    for ax, (name, (weights, visible)) in zip(axes[0], maps.items()):
        grid = np.ma.masked_array(weights.numpy(), mask=~visible.numpy())
        image = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=max(float(weights.max()), 1e-6), interpolation="nearest")
        ax.set_title(get_variant(name).title, fontsize=10)
        ticks = range(0, n, max(1, n // 14))
        ax.set_xticks(list(ticks), [labels[i] for i in ticks], rotation=90, fontsize=5)
        ax.set_yticks(list(ticks), [labels[i] for i in ticks], fontsize=5)
        ax.set_xlabel("key", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03).ax.tick_params(labelsize=6)
    axes[0][0].set_ylabel("query", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def default_text() -> str:
    """The opening of the first held-out scene of the embedded corpus."""
    from ..data.corpus import embedded_documents

    return next(iter(embedded_documents("validation")))


def attention_maps(model: Transformer, tokenizer, *, text: str | None = None, tokens: int = 27, layer: int = 11,
                   head: int = 0, window: int = 8, variants=FIGURE_3, seed: int = 0):
    """(figure, maps, token labels). ``layer`` is clipped to the model's depth."""
    ids = tokenizer.encode(text or default_text(), add_special_tokens=False)[:tokens]
    if not ids:
        raise ValueError("--text gives no tokens; pass a non-empty text.")
    layer = min(layer, len(model.blocks) - 1)
    if not 0 <= head < model.cfg.n_head:
        raise ValueError(f"--head must lie in [0, {model.cfg.n_head - 1}], got {head}.")
    device = next(model.parameters()).device
    idx = torch.tensor([ids], device=device)
    q, k = layer_qk(model.eval(), idx, layer)
    gates = layer_gates(model, idx, layer, head)
    # the model's own σ where it draws one (a random-keys model draws a key table, which is no permutation)
    own = model.draws(len(ids), 0, device)[layer] if model.variant.uses_permutation else None
    maps = variant_maps(q.cpu(), k.cpu(), head, list(variants), window, block_size=max(1, window // 2),
                        top_k=2, seed=seed, layer=layer, perm=own, gates=gates)
    labels = [tokenizer.decode([t]).replace("\n", "\\n") for t in ids]
    trained = model.cfg.attention
    title = (f"Attention weights, layer {layer}, head {head}, {len(ids)} tokens; masks drawn at w={window}, on the "
             f"queries and keys of a {trained.variant} model trained at w={trained.window}")
    for gated in (get_variant(v) for v in variants if get_variant(v).gated):
        title += (f"; {gated.label} weighted by its learned gates" if gates and set(gates) == set(gated.paths) else
                  f"; {gated.label}: equal weights (the model learned no gates for its paths)")
    return draw(maps, labels, title), maps, labels


def main(argv: list[str] | None = None) -> Path:
    from ..data.tokenizer import load_tokenizer
    from ..models.checkpoint import load_checkpoint

    p = argparse.ArgumentParser(prog="cli.py analyze attention-maps", **doc_help(__doc__))
    p.add_argument("--ckpt", required=True, help="a checkpoint written by `cli.py fit`")
    p.add_argument("--text", default=None, help="text to attend over (default: the embedded held-out text)")
    p.add_argument("--tokens", type=int, default=27, help="tokens of the text shown (Figure 3: 27)")
    p.add_argument("--layer", type=int, default=11, help="clipped to the model's last layer")
    p.add_argument("--head", type=int, default=0, help="the head whose map is drawn")
    p.add_argument("--window", type=int, default=8, help="the window w of the masks drawn (Figure 3: 8)")
    p.add_argument("--variants", nargs="+", default=list(FIGURE_3), help="the variants' masks drawn, a panel each")
    p.add_argument("--seed", type=int, default=0, help="seed of the SA masks when the model draws no permutation of its own (full, swa, moba)")
    p.add_argument("--out", type=output_folder, default=Path("outputs/analysis"),
                   help="the folder of attention_maps.png")
    args = p.parse_args(argv)
    for name in args.variants:
        get_variant(name)
    for name, value in (("--tokens", args.tokens), ("--window", args.window)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    model, info = load_checkpoint(args.ckpt)
    fig, _, _ = attention_maps(model, load_tokenizer(info["tokenizer"]), text=args.text, tokens=args.tokens,
                               layer=args.layer, head=args.head, window=args.window, variants=args.variants,
                               seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "attention_maps.png"
    save_figure(fig, path, dpi=160)
    print(f"wrote {path}")
    return path
