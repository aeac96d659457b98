"""Attention masks read as graphs: the paper's connectome picture (Figure 1b), the spectrum of the
mixing operator (Appendix A.4) and the small-world statistics of Sec. 3.2.

Every mask comes from ``mechanism.LayerSampler`` (the variant registry under ``causal``, Appendix A's
circular window under ``theory``), and layer ``l`` of a stack draws its permutation exactly as the
model does in ``fixed`` mode: ``sample_permutation(n, generator=layer_generator(seed, l))``.

A mask is an (n, n) bool tensor, [i, j] True when query i reads key j. Graph measures take the
undirected graph with an edge i - j when either token reads the other, without self-loops.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee, shortest_path
from scipy.sparse.linalg import svds

from ..attention import get_variant, layer_generator, masks
from ..attention.variants import SA, SA_SWA, SWA
from .mechanism import LayerSampler

#: the graphs every command compares: SA+SWA is the union of the two paths' edges (connectome,
#: small world) or the mean of their two operators (spectrum: equal gates).
GRAPHS = tuple(v.name for v in (SWA, SA, SA_SWA))


# ---- masks -----------------------------------------------------------------------------------------
def layer_stack(variant: str, n: int, window: int, layers: int, *, seed: int = 0,
                convention: str = "causal") -> list[np.ndarray]:
    """The (n, n) bool masks of ``layers`` layers, one permutation per layer as the model draws it (a deterministic
    control's pattern tuned for a model of ``layers`` layers, ``AttentionSpec.depth``)."""
    sampler = LayerSampler(variant, n, window, convention, depth=layers if layers >= 1 else None)
    return [sampler.draw(layer_generator(seed, layer)).numpy() for layer in range(layers)]


def undirected(mask: np.ndarray) -> sp.csr_matrix:
    """Symmetric 0/1 adjacency without self-loops: i - j when i reads j or j reads i."""
    adj = sp.csr_matrix((mask | mask.T).astype(np.int8))
    adj.setdiag(0)
    adj.eliminate_zeros()
    return adj


def stack_union(masks: list[np.ndarray]) -> np.ndarray:
    """Which key each query reaches in at least one layer of the stack."""
    return np.logical_or.reduce(masks)


# ---- connectome (Figure 1b) -----------------------------------------------------------------------
def rcm_order(adj: sp.csr_matrix) -> np.ndarray:
    """Reverse Cuthill-McKee order of a symmetric adjacency: ``order[p]`` is the node placed at p."""
    return np.asarray(reverse_cuthill_mckee(adj.tocsr(), symmetric_mode=True))


def edge_spans(adj: sp.csr_matrix, order: np.ndarray | None = None) -> np.ndarray:
    """|pos(i) - pos(j)| of every edge i < j, positions in ``order`` (default: token order)."""
    upper = sp.triu(adj, k=1).tocoo()
    if order is None:
        return np.abs(upper.row - upper.col)
    pos = np.empty_like(order)
    pos[order] = np.arange(len(order))
    return np.abs(pos[upper.row] - pos[upper.col])


def band_fraction_random(n: int, band: int) -> float:
    """Share of all unordered pairs i != j that lie within |i - j| <= band (what a graph whose edges
    ignore the order would put in the band)."""
    band = min(band, n - 1)
    return band * (2 * n - band - 1) / (n * (n - 1))


def band_statistics(adj: sp.csr_matrix, band: int, order: np.ndarray | None = None) -> dict:
    """Bandwidth, share of edges within ``band`` of the diagonal, and mean edge span / n."""
    n = adj.shape[0]
    spans = edge_spans(adj, order)
    if not len(spans):
        return {"bandwidth": 0, "band_fraction": 1.0, "mean_span": 0.0}
    return {"bandwidth": int(spans.max()), "band_fraction": float((spans <= band).mean()),
            "mean_span": float(spans.mean() / n)}


def connectome(n: int, window: int, layers: int, *, seed: int = 0, convention: str = "causal") -> dict:
    """Per graph: the stack's union mask, its undirected adjacency, the RCM order and the band
    statistics before and after it (the band is the window w), and the same statistics of an
    Erdos-Renyi graph of equal mean degree after RCM: what RCM makes of a graph with no order at all."""
    out = {}
    for variant in GRAPHS:
        union = stack_union(layer_stack(variant, n, window, layers, seed=seed, convention=convention))
        adj = undirected(union)
        order = rcm_order(adj)
        rand = random_graph(n, adj.nnz / n, seed)
        out[variant] = {"mask": union, "adjacency": adj, "order": order,
                        "raw": band_statistics(adj, window), "rcm": band_statistics(adj, window, order),
                        "random_rcm": band_statistics(rand, window, rcm_order(rand)), "mean_degree": adj.nnz / n}
    return out


# ---- spectrum (Appendix A.4) ----------------------------------------------------------------------
def mixing_operator(mask: np.ndarray) -> sp.csr_matrix:
    """Uniform attention over the mask: each query's row spreads 1 evenly over the keys it reads."""
    adj = sp.csr_matrix(mask.astype(np.float64))
    return sp.diags(1.0 / np.maximum(adj.sum(1).A1, 1.0)) @ adj


def layer_operators(graph: str, n: int, window: int, layers: int, *, seed: int = 0,
                    convention: str = "theory") -> list[sp.csr_matrix]:
    """One uniform-attention operator per layer. SA+SWA is the gated pair with equal gates: the mean of
    the SA and SWA operators of the same permutation."""
    paths = get_variant(graph).paths
    if len(paths) == 1:
        return [mixing_operator(m) for m in layer_stack(graph, n, window, layers, seed=seed, convention=convention)]
    stacks = [layer_stack(p, n, window, layers, seed=seed, convention=convention) for p in paths]
    return [sum(mixing_operator(m) for m in per_layer) / len(paths) for per_layer in zip(*stacks)]


def operator_eigenvalues(op: sp.spmatrix) -> np.ndarray:
    """All eigenvalues, largest real part first. Symmetric: ``eigvalsh``. Triangular (every causal
    operator): the diagonal, exactly. Otherwise the general solver."""
    dense = op.toarray()
    if np.allclose(dense, dense.T, atol=1e-12):
        values = np.linalg.eigvalsh(dense).astype(complex)
    elif not np.triu(dense, 1).any() or not np.tril(dense, -1).any():
        values = np.diag(dense).astype(complex)
    else:
        values = np.linalg.eigvals(dense)
    return values[np.argsort(-values.real, kind="stable")]


def circulant_lambda2(n: int, window: int) -> float:
    """Second eigenvalue of Appendix A's circular SWA operator A_w / m, m = 2*ceil(w/2) - 1 slots:
    sin(pi m / n) / (m sin(pi / n)), whose gap is about pi^2 (m^2 - 1) / (6 n^2) = O(w^2 / n^2)."""
    m = min(n, masks.sa_band_others(window) + 1)
    if m >= n:
        return 0.0
    return math.sin(math.pi * m / n) / (m * math.sin(math.pi / n))


def second_singular_value(product: np.ndarray) -> float:
    """sigma_2 of a doubly stochastic matrix: the norm of its action orthogonal to the constant vector,
    ||M - J/n||_2, which bounds how fast any start distribution approaches uniform."""
    centered = product - product.mean(0, keepdims=True)  # M - (1/n) 1 1^T M = M - J/n here
    return float(svds(centered, k=1, return_singular_vectors=False, random_state=0)[0])


def tv_to_uniform(product: np.ndarray, causal: bool) -> float:
    """Mean over queries of the total-variation distance between the query's row of the product and the
    uniform distribution over the keys full attention would let it read (all n, or 0..i when causal)."""
    n = product.shape[0]
    visible = np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)
    uniform = visible / visible.sum(1, keepdims=True)
    return float(0.5 * np.abs(product - uniform).sum(1).mean())


def mixing_curve(operators: list[sp.csr_matrix], causal: bool) -> list[dict]:
    """For L = 1..len(operators): sigma_2 of A_L ... A_1 (non-causal only) and its mean TV distance to
    uniform attention."""
    product = np.eye(operators[0].shape[0])
    rows = []
    for depth, op in enumerate(operators, start=1):
        product = op @ product
        rows.append({"layers": depth, "sigma2": float("nan") if causal else second_singular_value(product),
                     "tv_to_uniform": tv_to_uniform(product, causal)})
    return rows


# ---- small world (Sec. 3.2) -----------------------------------------------------------------------
def clustering_coefficient(adj: sp.csr_matrix) -> float:
    """Mean local clustering (Watts-Strogatz): triangles through i over k_i (k_i - 1) / 2; nodes of
    degree < 2 count as 0."""
    adj = adj.astype(np.float64).tocsr()
    degree = adj.sum(1).A1
    triangles = (adj @ adj).multiply(adj).sum(1).A1 / 2
    pairs = degree * (degree - 1) / 2
    local = np.divide(triangles, pairs, out=np.zeros_like(triangles), where=pairs > 0)
    return float(local.mean())


def path_length(adj: sp.csr_matrix) -> tuple[float, float]:
    """(characteristic path length: mean hop count over connected pairs i != j, share of pairs connected)."""
    n = adj.shape[0]
    hops = shortest_path(adj, method="D", directed=False, unweighted=True)
    off = ~np.eye(n, dtype=bool)
    finite = np.isfinite(hops) & off
    return (float(hops[finite].mean()) if finite.any() else float("inf")), float(finite.sum() / off.sum())


def random_graph(n: int, mean_degree: float, seed: int = 0) -> sp.csr_matrix:
    """Erdos-Renyi G(n, p) with p = mean_degree / (n - 1): the same expected degree."""
    rng = np.random.default_rng(seed)
    upper = np.triu(rng.random((n, n)) < mean_degree / (n - 1), 1)
    return sp.csr_matrix(upper | upper.T, dtype=np.int8)


def ring_lattice_clustering(k: int) -> float:
    """Clustering of a ring where every node links to its k/2 nearest on each side: 3(k-2) / (4(k-1))."""
    return 3 * (k - 2) / (4 * (k - 1))


def small_world_row(adj: sp.csr_matrix, seed: int = 0) -> dict:
    """C and L of the graph against an Erdos-Renyi graph of the same mean degree k, both sampled and
    analytic (C = k / (n - 1), L = ln n / ln k); sigma = (C / C_rand) / (L / L_rand), sampled."""
    n = adj.shape[0]
    k = adj.nnz / n
    clustering, length, connected = clustering_coefficient(adj), *path_length(adj)
    rand = random_graph(n, k, seed)
    c_rand, (l_rand, _) = clustering_coefficient(rand), path_length(rand)
    return {"n": n, "mean_degree": k, "clustering": clustering, "path_length": length, "connected": connected,
            "clustering_random": c_rand, "path_length_random": l_rand,
            "clustering_random_analytic": k / (n - 1),
            "path_length_random_analytic": math.log(n) / math.log(k) if k > 1 else float("inf"),
            "sigma": (clustering / c_rand) / (length / l_rand) if c_rand > 0 and length > 0 else float("nan")}


def small_world(n: int, window: int, layers: int, *, seed: int = 0, convention: str = "theory",
                progress=print) -> list[dict]:
    """One row per (scope, graph): ``layer`` is one layer's mask (layer 0), ``stack`` the union of the
    ``layers`` layers' masks (every edge some layer offers)."""
    rows = []
    for graph in GRAPHS:
        masks = layer_stack(graph, n, window, layers, seed=seed, convention=convention)
        for scope, mask in (("layer", masks[0]), ("stack", stack_union(masks))):
            row = {"scope": scope, "graph": graph, "layers": 1 if scope == "layer" else layers, "window": window,
                   "convention": convention, **small_world_row(undirected(mask), seed=seed)}
            progress(f"small-world {scope:>5} {graph:>6}: k={row['mean_degree']:.1f}  C={row['clustering']:.4f} "
                     f"(random {row['clustering_random']:.4f})  L={row['path_length']:.2f} "
                     f"(random {row['path_length_random']:.2f})  sigma={row['sigma']:.1f}")
            rows.append(row)
    return rows
