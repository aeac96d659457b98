"""A variant's call is its one door: every registered variant checks its inputs, guards non-finite keys and values
and adds sinks there, exactly once; the registry finds a variant's file by name and imports it alone."""
import ast
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sa_lightning.attention import AttentionSpec, get_variant, oracle, register_variant, variant_names
from sa_lightning.attention._finite import check_finite
from sa_lightning.attention.registry import VARIANTS

B, HQ, HKV, N, D, W, SINK = 2, 2, 1, 48, 8, 8, 4
BAD = 20  # the token whose value is NaN (row 0)
VARIANTS_DIR = Path(__file__).resolve().parents[1] / "sa_lightning" / "attention" / "variants"


def _spec(name, sink=0):
    return AttentionSpec(name, window=W, block_size=8, top_k=2, sink=sink)


def _inputs(name, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, N, D, generator=g, dtype=torch.float64) for h in (HQ, HKV, HKV))
    variant = get_variant(name)
    draw = variant.draw(_spec(name), N, None, g) if variant.draws else None
    return q, k, v, draw


def _expand(mask):
    return mask.expand(B, HQ, N, N)


@pytest.mark.parametrize("name", variant_names())
def test_every_variant_guards_non_finite_values_in_its_call(name):
    """A NaN value reaches exactly the rows whose mask holds its token, in every path; every other row is the
    float64 oracle's on the clean inputs (the guard runs in the call, whatever the variant's kernel)."""
    variant, spec = get_variant(name), _spec(name)
    q, k, v, draw = _inputs(name)
    bad = v.clone()
    bad[0, 0, BAD, 3] = float("nan")
    with check_finite():
        outs = variant(q, k, bad, spec, draw)
    clean = torch.where(torch.isfinite(bad), bad, 0)
    masks = variant.oracle_masks(spec, q, k, draw)
    assert len(outs) == len(masks) == len(variant.paths)
    for y, mask in zip(outs, masks):
        mask = _expand(mask)
        sees = torch.zeros(B, HQ, N, dtype=torch.bool)
        sees[0] = mask[0, :, :, BAD]  # every query head reads kv head 0
        assert sees.any() and (~sees).any()
        want = oracle.reference_attention(q, k, clean, mask)
        torch.testing.assert_close(y[~sees], want[~sees], atol=1e-5, rtol=0)
        assert torch.isnan(y[sees][:, 3]).all(), "a row that reads the NaN value is finite where it reads it"


@pytest.mark.parametrize("name", variant_names())
def test_every_variant_checks_its_inputs_in_its_call(name):
    """Shapes and ``lengths`` are checked in the call, for every variant (full attention and SWA included)."""
    variant, spec = get_variant(name), _spec(name)
    q, k, v, draw = _inputs(name)
    with pytest.raises(ValueError, match="k/v sequence length 47 does not match q's length 48"):
        variant(q, k[:, :, 1:], v[:, :, 1:], spec, draw)
    with pytest.raises(ValueError, match=r"lengths must lie in \[1, 48\]"):
        variant(q, k, v, spec, draw, torch.tensor([N, N + 1]))


def _sink_cases():
    return [name for name in variant_names() if get_variant(name).takes_sink]


@pytest.mark.parametrize("name", _sink_cases())
def test_sinks_are_added_once_in_the_call(name):
    """With sinks, output and log-sum-exp are the oracle's over the variant's mask plus the first SINK keys: a sink
    key its own mask already holds, or one merged twice, would count twice and move both."""
    variant, spec = get_variant(name), _spec(name, sink=SINK)
    q, k, v, draw = _inputs(name, seed=1)
    (mask,) = variant.oracle_masks(spec, q, k, draw)
    i, j = torch.arange(N).view(-1, 1), torch.arange(N).view(1, -1)
    mask = _expand(mask) | ((j < SINK) & (j <= i))
    (y,) = variant(q, k, v, spec, draw)
    y2, lse = variant(q, k, v, spec, draw, return_lse=True)
    want = oracle.reference_attention(q, k, v, mask)
    scores = (q @ k.repeat_interleave(HQ // HKV, dim=1).transpose(-1, -2)) * D ** -0.5
    want_lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(y, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(y2, y, atol=0, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=0)
    without = oracle.reference_attention(q, k, v, _expand(variant.oracle_masks(_spec(name), q, k, draw)[0]))
    assert not torch.allclose(y, without, atol=1e-3), "the sinks changed nothing: the test cannot tell"


def test_a_variant_without_a_kernel_with_lse_is_refused_sinks_in_one_sentence():
    with pytest.raises(ValueError, match="sink applies to the variants"):
        AttentionSpec("moba", sink=2)
    q, k, v, _ = _inputs("moba")
    with pytest.raises(ValueError, match="'moba' has no kernel with log-sum-exp"):
        get_variant("moba")(q, k, v, _spec("moba"), return_lse=True)


def test_a_name_is_registered_once():
    """A built-in name is taken before its file is ever read, and a new name once registered is taken too."""
    swa = get_variant("swa")
    with pytest.raises(ValueError, match="variant name 'strided_local' is taken"):
        register_variant(dataclasses.replace(swa, name="strided_local"))
    first = dataclasses.replace(swa, name="swa_again")
    try:
        assert register_variant(first) is first and register_variant(first) is first
        with pytest.raises(ValueError, match="variant name 'swa_again' is taken"):
            register_variant(dataclasses.replace(swa, name="swa_again", label="another"))
        assert get_variant("swa_again") is first and variant_names()[-1] == "swa_again"
    finally:
        VARIANTS.pop("swa_again", None)
    assert "swa_again" not in variant_names()
    with pytest.raises(ValueError, match="built-in variant"):
        VARIANTS.pop("swa")


#: what asking for a variant may import of the variants folder: itself and the variants it is built from
IMPORTS = {"sa": {"sa"}, "swa": {"swa"}, "moba": {"moba"}, "strided": {"strided"},
           "random_swa": {"random_swa", "random", "random_swa_union", "swa"}}

PROBE = """
import json, sys
def loaded():
    return sorted(m.rsplit(".", 1)[1] for m in sys.modules
                  if m.startswith("sa_lightning.attention.variants.") and not m.rsplit(".", 1)[1].startswith("_"))
import sa_lightning.attention.registry as registry
at_import = loaded()
names = registry.variant_names()
after_names = loaded()
variant = registry.get_variant(sys.argv[1])
print(json.dumps({"at_import": at_import, "after_names": after_names, "names": list(names), "asked": loaded(),
                  "same": variant is registry.get_variant(sys.argv[1])}))
"""


@pytest.mark.slow  # one process per variant asked for
@pytest.mark.parametrize("name", sorted(IMPORTS))
def test_asking_for_one_variant_imports_its_file_alone(name):
    proc = subprocess.run([sys.executable, "-c", PROBE, name], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["at_import"] == [] and got["after_names"] == [], "listing the names imported a variant"
    assert set(got["names"]) >= set(IMPORTS) and got["names"][:3] == ["full", "swa", "sa"]
    assert set(got["asked"]) == IMPORTS[name] and got["same"]


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield ("." * node.level) + (node.module or ""), [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from ((a.name, []) for a in node.names)


def test_variant_files_import_no_private_name_and_neither_the_guard_nor_the_public_functions():
    """The variants compute: the guard and the checks are the call's (registry), and the public functions sit above
    the variants, so a call goes down the layers once (functional -> registry's door -> variant -> kernel)."""
    files = sorted(VARIANTS_DIR.glob("*.py"))
    assert len(files) > 10
    for path in files:
        for module, names in _imports(path):
            assert not [n for n in names if n.startswith("_")], f"{path.name} imports a private name from {module}"
            assert module not in ("..functional", ".._finite"), f"{path.name} imports {module}"
    registry = Path(VARIANTS_DIR.parent, "registry.py")
    assert not [m for m, names in _imports(registry) if "variants" in m or "variants" in names], \
        "the registry imports the variants statically (it finds them by name)"
