"""The learned gates of an SA+SWA checkpoint (Eq. 6-7; the bias-variance balance of Appendix A.5).

For every layer, head and query, g_sa and g_swa are the gate activations sigmoid(W_p Y_p) averaged
over the head's channels (``attention_maps.layer_gates``), on held-out text with the model's own
permutations. The command reports:
- their mean and distribution per layer;
- how they change with the query's position (its context grows past the window at i = w);
- how they change with the distance of the keys each path actually reads: the path's attention-weighted
  mean key distance sum_j A_p[i, j] (i - j), divided by the farthest key the path could read for that
  query (SA: the farthest key in its window; SWA: min(i, w - 1)). 0 means the path reads only its
  nearest keys, 1 only its farthest. Only queries with i >= w enter, so the context is past the window
  and the measure is not a proxy for the position.

    python cli.py analyze gates --ckpt runs/tiny/tb/version_0/checkpoints/last.ckpt
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..attention import AttentionSpec, get_variant, masks
from ..attention.variants import SA, SA_SWA, SWA
from ..utils.atomic import add_overwrite, output_folder, replacing_files
from ..utils.report import pyplot, save_figure
from ..utils.tables import write_csv
from .attention_maps import layer_gates, layer_qk, variant_maps
from ..utils.argtypes import doc_help

PATHS = SA_SWA.paths
REACH_BINS = 10
MIN_PLOTTED = 30  # buckets with fewer (sequence, head, query) values stay in the CSV but not in the plot


def check_two_gates(model) -> None:
    """One clear sentence unless every layer has the SA and SWA gates."""
    if set(model.cfg.paths) != set(PATHS):
        raise ValueError(f"`analyze gates` needs an SA+SWA checkpoint (model.arch.attention.variant: sa_swa, two gates per "
                         f"layer); this one is {model.cfg.attention.variant!r} with the gate(s) {', '.join(model.cfg.paths)}.")


def held_out_sequences(tokenizer, tokens: int, count: int, text: str | None = None) -> list[torch.Tensor]:
    """``count`` sequences of exactly ``tokens`` ids: consecutive chunks of ``text``, or the openings of the
    embedded held-out scenes that are long enough."""
    if text is not None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        chunks = [ids[i:i + tokens] for i in range(0, len(ids) - tokens + 1, tokens)][:count]
    else:
        from ..data.corpus import embedded_documents

        chunks = []
        for doc in embedded_documents("validation"):
            ids = tokenizer.encode(doc, add_special_tokens=False)
            if len(ids) >= tokens:
                chunks.append(ids[:tokens])
            if len(chunks) == count:
                break
    if not chunks:
        raise ValueError(f"no text of at least --tokens {tokens} tokens; pass a longer --text or a smaller --tokens.")
    return [torch.tensor(c) for c in chunks]


def path_reach(model, n: int, layer: int) -> dict[str, torch.Tensor]:
    """Per path, the farthest key distance each query may read in ``layer``, with the model's own SA
    permutation (stream 0, as ``layer_gates`` runs the model)."""
    perm = model.draws(n, 0, "cpu")[layer]
    spec = AttentionSpec(SA_SWA.name, window=model.cfg.attention.window)
    distance = (torch.arange(n).view(-1, 1) - torch.arange(n).view(1, -1)).double()
    reach = {}
    for path in PATHS:
        visible = masks.dense(get_variant(path).mask(spec, n, perm), n)[0, 0]
        reach[path] = torch.where(visible, distance, torch.zeros_like(distance)).amax(1)
    return reach


def read_distance(model, idx: torch.Tensor, layer: int, q: torch.Tensor, k: torch.Tensor, head: int) -> dict:
    """Per path, each query's attention-weighted mean key distance in ``head``, (n,)."""
    n = idx.shape[1]
    perm = model.draws(n, 0, "cpu")[layer]
    maps = variant_maps(q.cpu(), k.cpu(), head, list(PATHS), model.cfg.attention.window, perm=perm)
    distance = (torch.arange(n).view(-1, 1) - torch.arange(n).view(1, -1)).double()
    return {path: (maps[path][0] * distance).sum(1) for path in PATHS}


def collect(model, sequences: list[torch.Tensor], progress=print) -> dict[int, dict[str, dict[str, torch.Tensor]]]:
    """{layer: {path: {"gate": (S, H, n), "distance": (S, H, n)}}}: the gate activation and the
    attention-weighted key distance of every (sequence, head, query)."""
    model = model.eval()
    device = next(model.parameters()).device
    out = {}
    for layer in range(len(model.blocks)):
        rows = {p: {"gate": [], "distance": []} for p in PATHS}
        for seq in sequences:
            idx = seq.view(1, -1).to(device)
            q, k = layer_qk(model, idx, layer)
            per_head = {p: {"gate": [], "distance": []} for p in PATHS}
            for head in range(model.cfg.n_head):
                gates = layer_gates(model, idx, layer, head)
                distances = read_distance(model, idx, layer, q, k, head)
                for p in PATHS:
                    per_head[p]["gate"].append(gates[p])
                    per_head[p]["distance"].append(distances[p])
            for p in PATHS:
                for key in ("gate", "distance"):
                    rows[p][key].append(torch.stack(per_head[p][key]))
        out[layer] = {p: {key: torch.stack(v) for key, v in rows[p].items()} for p in PATHS}
        progress(f"gates layer {layer}: mean g_sa {out[layer][SA.name]['gate'].mean():.4f}  "
                 f"g_swa {out[layer][SWA.name]['gate'].mean():.4f}  ({len(sequences)} sequences x "
                 f"{model.cfg.n_head} heads x {sequences[0].numel()} queries)")
    return out


def summary_rows(data: dict) -> list[dict]:
    """Per layer and path: mean, std and deciles over every (sequence, head, query), then per head."""
    rows = []
    for layer, paths in data.items():
        for path, d in paths.items():
            gate = d["gate"]
            heads = [("all", gate.flatten())] + [(h, gate[:, h].flatten()) for h in range(gate.shape[1])]
            for head, values in heads:
                p10, p50, p90 = torch.quantile(values, torch.tensor([0.1, 0.5, 0.9], dtype=values.dtype)).tolist()
                rows.append({"layer": layer, "path": path, "head": head, "count": values.numel(),
                             "mean": values.mean().item(), "std": values.std().item(), "p10": p10, "median": p50,
                             "p90": p90})
    return rows


def position_bins(n: int) -> list[tuple[int, int]]:
    """[0, 1), [1, 2), [2, 4), [4, 8), ... up to n."""
    edges, lo = [(0, 1)], 1
    while lo < n:
        edges.append((lo, min(2 * lo, n)))
        lo *= 2
    return edges


def _bucket_row(layer, path, axis, lo, hi, values) -> dict:
    return {"layer": layer, "path": path, "axis": axis, "lo": lo, "hi": hi, "count": values.numel(),
            "mean": values.mean().item() if values.numel() else float("nan"),
            "std": values.std().item() if values.numel() > 1 else float("nan")}


def distance_rows(data: dict, model) -> list[dict]:
    """Mean gate per bucket of query position, and per bucket of relative read distance (queries i >= w)."""
    rows = []
    window = model.cfg.attention.window
    for layer, paths in data.items():
        n = paths[PATHS[0]]["gate"].shape[-1]
        reach = path_reach(model, n, layer)
        position = torch.arange(n)
        for path, d in paths.items():
            gate = d["gate"]
            for lo, hi in position_bins(n):
                rows.append(_bucket_row(layer, path, "query_position", lo, hi, gate[..., lo:hi].flatten()))
            past = position >= window
            span = reach[path].clamp(min=1.0)
            relative = (d["distance"] / span)[..., past].flatten().clamp(0.0, 1.0)
            values = gate[..., past].flatten()
            bucket = (relative * REACH_BINS).long().clamp(max=REACH_BINS - 1)
            for b in range(REACH_BINS):
                rows.append(_bucket_row(layer, path, "relative_read_distance", b / REACH_BINS, (b + 1) / REACH_BINS,
                                        values[bucket == b]))
    return rows


#: one colour per layer in the two right panels: dark, told apart from each other and from white (viridis'
#: light end vanished on it); they cycle past four layers
LAYER_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#a6761d", "#666666", "#e6ab02")
#: how each path's line looks in the two right panels: SA solid with small filled circles, SWA dashed with
#: larger hollow squares, so that where the two paths' means are equal the circle shows inside the square
PATH_STYLES = {SA.name: {"linestyle": "-", "marker": "o", "markerfacecolor": None, "markersize": 4.0},
               SWA.name: {"linestyle": "--", "marker": "s", "markerfacecolor": "none", "markersize": 6.5}}


def draw(data: dict, buckets: list[dict], title: str):
    """Three panels: per-layer distributions, mean gate against query position and against the relative
    read distance. Returns the matplotlib figure.

    In the two right panels a layer is a colour and a path a line style and marker; their legends sit below
    the panels, outside every axis, so that no line runs under them."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    gen = torch.Generator().manual_seed(0)
    for offset, path in zip((-0.18, 0.18), PATHS):
        values = []
        for layer in data:
            flat = data[layer][path]["gate"].flatten()
            values.append(flat[torch.randperm(flat.numel(), generator=gen)[:20000]].numpy())
        parts = axes[0].violinplot(values, positions=[layer + offset for layer in data], widths=0.32,
                                   showmeans=True, showextrema=False)
        for body in parts["bodies"]:
            body.set_color(get_variant(path).color)
        parts["cmeans"].set_color(get_variant(path).color)
        axes[0].plot([], [], color=get_variant(path).color, linewidth=6, alpha=0.5, label=f"g_{path} (bar: mean)")
    axes[0].set(xlabel="layer", ylabel="gate activation (head mean)", xticks=list(data), title="distribution per layer")
    for axis, ax, xlabel in (("query_position", axes[1], "query position i (bucket start)"),
                             ("relative_read_distance", axes[2], "path's attention-weighted key distance / its reach")):
        for layer in data:
            color = LAYER_COLORS[layer % len(LAYER_COLORS)]
            for path, style in PATH_STYLES.items():
                pts = [(r["lo"] if axis == "query_position" else (r["lo"] + r["hi"]) / 2, r["mean"]) for r in buckets
                       if r["layer"] == layer and r["path"] == path and r["axis"] == axis
                       and r["count"] >= MIN_PLOTTED]
                if pts:
                    ax.plot(*zip(*pts), color=color, markeredgewidth=1.1, linewidth=1.4,
                            **{**style, "markerfacecolor": style["markerfacecolor"] or color})
        ax.set(xlabel=xlabel, ylabel="mean gate")
        if axis == "query_position":
            ax.set_xscale("symlog", linthresh=1)
            starts = sorted({r["lo"] for r in buckets if r["axis"] == axis})
            ax.set_xticks(starts, [str(s) for s in starts], fontsize=8)
            ax.xaxis.set_minor_locator(plt.NullLocator())
    axes[1].set_title("against the query's position")
    axes[2].set_title("against how far back the path reads (i ≥ w)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    # the legends in a strip kept free below the panels, outside every axis and inside the image however it is
    # saved: the distribution panel's paths, and the right panels' layers (colours) and paths (line styles)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    from matplotlib.lines import Line2D

    def below(ax_from, ax_to, handles, ncol):
        x0, x1 = ax_from.get_position().x0, ax_to.get_position().x1
        fig.legend(handles=handles, loc="lower center", bbox_to_anchor=((x0 + x1) / 2, 0.0), ncol=ncol, fontsize=8,
                   frameon=False)

    below(axes[0], axes[0], axes[0].get_legend_handles_labels()[0], 2)
    keys = [Line2D([], [], color=LAYER_COLORS[layer % len(LAYER_COLORS)], linewidth=2.5, label=f"layer {layer}")
            for layer in data]
    keys += [Line2D([], [], color="black", linewidth=1.4, label=f"g_{path}",
                    **{**style, "markerfacecolor": style["markerfacecolor"] or "black"})
             for path, style in PATH_STYLES.items()]
    below(axes[1], axes[2], keys, len(keys))
    return fig


def main(argv: list[str] | None = None) -> Path:
    from ..data.tokenizer import load_tokenizer
    from ..models.checkpoint import load_checkpoint

    p = argparse.ArgumentParser(prog="cli.py analyze gates", **doc_help(__doc__))
    p.add_argument("--ckpt", required=True, help="an SA+SWA checkpoint written by `cli.py fit`")
    p.add_argument("--text", default=None, help="text to run (default: the embedded held-out scenes)")
    p.add_argument("--tokens", type=int, default=None, help="tokens per sequence (default: the model's max_seq_len)")
    p.add_argument("--sequences", type=int, default=8, help="how many sequences")
    p.add_argument("--out", type=output_folder, default=Path("outputs/analysis"),
                   help="the folder of gates.csv, gates_by_distance.csv and gates.png")
    add_overwrite(p)
    args = p.parse_args(argv)
    for name, value in (("--tokens", args.tokens), ("--sequences", args.sequences)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}.")
    model, info = load_checkpoint(args.ckpt)
    check_two_gates(model)
    tokens = args.tokens or model.cfg.max_seq_len
    if tokens > model.cfg.max_seq_len:
        raise ValueError(f"--tokens {tokens} exceeds the model's max_seq_len={model.cfg.max_seq_len}.")
    sequences = held_out_sequences(load_tokenizer(info["tokenizer"]), tokens, args.sequences, args.text)
    data = collect(model, sequences)
    summary, buckets = summary_rows(data), distance_rows(data, model)
    title = (f"SA+SWA gates, {info['path']} (step {info['step']}), w={model.cfg.attention.window}, "
             f"{len(sequences)} held-out sequences of {tokens} tokens")
    with replacing_files(args.out, "gate analysis", args.overwrite) as tmp:  # the three together, or none
        write_csv(tmp / "gates.csv", summary, digits=6)
        write_csv(tmp / "gates_by_distance.csv", buckets, digits=6)
        save_figure(draw(data, buckets, title), tmp / "gates.png", dpi=150)
    print(f"wrote {args.out / 'gates.csv'}, {args.out / 'gates_by_distance.csv'} and {args.out / 'gates.png'}")
    return args.out / "gates.csv"
