"""A training step reads nothing back to the host: one forward and backward of the model, for every variant,
runs no ``aten._local_scalar_dense`` (what ``.item()``, ``int(t)`` and ``bool(t)`` dispatch to, and a GPU sync
each). The values of σ and of ``lengths`` are checked once at the model's boundary, never per layer. The draws
(σ, the random control's key table) are made on the host before the step and copied over."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sa_lightning.attention import VARIANTS, AttentionSpec, sample_permutation
from sa_lightning.models import ModelConfig, build_model


class CountSyncs(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _model(variant):
    cfg = ModelConfig(vocab_size=64, n_layer=3, n_head=2, d_model=32, max_seq_len=96,
                      attention=AttentionSpec(variant, window=16, block_size=16))
    return build_model(cfg)


@pytest.mark.parametrize("n", [96, 24])  # the banded kernels (n >= 2w) and the short rows' dense path
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_training_step_never_syncs_the_host(variant, n):
    torch.manual_seed(0)
    model = _model(variant)
    idx = torch.randint(0, 64, (2, n))
    # the layers' draws are host work made before the step (their generators live on the host, where the random
    # control also sizes its key table) and only copied to the device: the step itself must read nothing back
    draws = model.draws(n, 3, idx.device)
    model.draws = lambda *args, **kwargs: draws
    with CountSyncs() as syncs:
        model(idx, perm_stream=3).float().logsumexp(-1).mean().backward()
    assert syncs.count == 0


def test_a_callers_permutations_are_checked_once_at_the_boundary():
    """Given σ (not drawn by the model) is checked at ``forward``, once per layer's σ, and a bad one is refused."""
    model = _model(next(name for name, v in VARIANTS.items() if v.draws))
    idx = torch.randint(0, 64, (2, 96))
    perms = [sample_permutation(96, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    with CountSyncs() as syncs:
        model(idx, perms=perms)
    assert 0 < syncs.count <= 3 * len(perms)  # min, max and the counts of each σ: never per kernel call
    bad = [p.clone() for p in perms]
    bad[1][0] = bad[1][1]
    with pytest.raises(ValueError, match="perm"):
        model(idx, perms=bad)
