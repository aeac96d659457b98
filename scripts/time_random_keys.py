"""One layer of the random-keys control on this CPU, one thread, best of three: the draw (hash seeds) and the
kernel it routes to, in prefill and in a training step. Run it from a checkout (or a worktree of another commit
with PYTHONPATH pointing there) to compare two versions side by side (docs/benchmarks.md)."""
import json
import time

import torch

from sa_lightning.attention import AttentionSpec, get_variant
from sa_lightning.attention.draws import layer_draws

torch.set_num_threads(1)
res = {}
CASES = [("random", 2048, 32, False), ("random", 8192, 256, False), ("random_swa_union", 2048, 32, False),
         ("random", 256, 16, True)]
for name, n, w, grad in CASES:
    v = get_variant(name); spec = AttentionSpec(name, window=w)
    B, Hq, Hkv = (1, 9, 3) if not grad else (16, 4, 4)
    d = 64 if not grad else 32
    g = torch.Generator().manual_seed(0)
    q, k, vv = (torch.randn(B, h, n, d, generator=g, requires_grad=grad) for h in (Hq, Hkv, Hkv))
    best = 1e9
    for rep in range(3):
        t = time.perf_counter()
        (dr,) = layer_draws(v, spec, n, [rep], seed=1, lengths=torch.full((B,), n) if grad else None)
        with torch.set_grad_enabled(grad):
            (y, *_) = v(q, k, vv, spec, dr)
            if grad: y.sum().backward()
        best = min(best, time.perf_counter() - t)
    res[f"{name} n={n} w={w}{' fwd+bwd B=16' if grad else ' fwd'}"] = round(best * 1000, 1)
print(json.dumps(res))
