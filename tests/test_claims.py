"""The claims table (docs/results.md) says no more than its intervals (issue 76, item 5): every "equivalent within
±δ" carries its 90% interval, inside ±δ, and the README's summary scopes its equivalences to their cell."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"([+−-]?\d+(?:\.\d+)?)"


def _number(text: str) -> float:
    return float(text.replace("−", "-").replace("+", ""))


def claims_rows(text: str) -> list[list[str]]:
    section = text.split("## The paper's claims")[1].split("\n## ")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| claim |")]
    return [r for r in rows if not set("".join(r)) <= set("-: ")]


def equivalences(cell: str) -> list[tuple[float, float, float]]:
    """Each "equivalent within ±δ" of a cell with the 90% interval that follows it: (δ, lo, hi); lo and hi None
    where no 90% interval follows before the next verdict."""
    out = []
    for found in re.finditer(r"equivalent within ±" + NUMBER, cell):
        rest = re.split(r"equivalent within|cannot decide|not separable|better|worse", cell[found.end():])[0]
        ninety = re.search(r"90% \[" + NUMBER + r", " + NUMBER + r"\]", rest)
        out.append((_number(found.group(1)), *((_number(ninety.group(1)), _number(ninety.group(2))) if ninety
                                               else (None, None))))
    return out


def check(text: str) -> list[str]:
    problems = []
    for row in claims_rows(text):
        for margin, lo, hi in equivalences(row[3]):
            if lo is None:
                problems.append(f"{row[0]}: equivalent within ±{margin} without its 90% interval")
            elif not -margin < lo <= hi < margin:
                problems.append(f"{row[0]}: 90% [{lo}, {hi}] is not inside ±{margin}")
    return problems


def test_every_equivalence_in_the_claims_table_has_its_90_percent_interval_inside_the_margin():
    text = (ROOT / "docs" / "results.md").read_text()
    assert len(claims_rows(text)) >= 8
    assert check(text) == []


def test_the_check_fails_on_a_claim_it_cannot_back():
    head = "## The paper's claims\n\n| claim | setting | control | verdict | see |\n|---|---|---|---|---|\n"
    bare = head + "| x | cell | c | **equivalent within ±0.40 nats**: +0.03 [−0.37, +0.43] | T |\n"
    wide = head + "| x | cell | c | equivalent within ±0.40 nats: +0.03 [−0.37, +0.43], 90% [−0.30, +0.41] | T |\n"
    held = head + "| x | cell | c | equivalent within ±0.40 nats: +0.03 [−0.37, +0.43], 90% [−0.30, +0.36] | T |\n"
    assert check(bare) == ["x: equivalent within ±0.4 without its 90% interval"]
    assert check(wide) == ["x: 90% [-0.3, 0.41] is not inside ±0.4"]
    assert check(held) == []


def test_the_readme_scopes_its_equivalences_to_their_cell():
    readme = (ROOT / "README.md").read_text()
    assert "not separable from Strided+local" not in readme  # Table 15b settled it
    for line in readme.splitlines():
        if "equivalent" in line and "nats" in line:
            assert "n = 128" in line or "Table 15" in line, line
