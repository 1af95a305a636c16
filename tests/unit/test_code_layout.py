"""Rules of the code's layout that import-linter does not check (it checks layers and cycles):
no module imports another's private names; the limits docs/architecture.md states: no module of
the product over 400 lines, no function over 60, no run of six lines written twice; and the
benchmarks import nothing from the tests (what both use lives in ``testkit/`` or in the
product). Each failure names the file and what to do."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "orchestrator"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
PACKAGES = ("orchestrator", "hydra_plugins")


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_imports_another_modules_private_names():
    """``from orchestrator.x import _name`` reaches into x's insides (fleet used runner's
    ``_loop_factory``): what another module needs is public."""
    found = []
    for path in [p for package in PACKAGES for p in _modules(ROOT / package)]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES:
                found += [
                    f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert found == []


def test_no_module_of_the_product_is_over_400_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _modules(PRODUCT) if (n := _lines(p)) > MAX_MODULE_LINES]
    assert not long, f"over {MAX_MODULE_LINES} lines (split by concept, a sibling module per idea): {long}"


def test_no_function_of_the_product_is_over_60_lines():
    long = []
    for path in _modules(PRODUCT):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert not long, f"over {MAX_FUNCTION_LINES} lines (extract its steps): {long}"


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_benchmarks_import_nothing_from_the_tests():
    reach = {
        str(p.relative_to(ROOT)): sorted(m for m in _imported(p) if m == "tests" or m.startswith("tests."))
        for p in _modules(ROOT / "benchmarks")
    }
    reach = {k: v for k, v in reach.items() if v}
    assert not reach, f"benchmarks importing tests (move what both use to testkit/): {reach}"


_THIN = re.compile(r"^[\s)\]}(\[{,:;]*$")  # lone brackets and commas
RUN = 6  # lines, as the library's `duplicates` counts them


def _kept(text: str) -> list[tuple[int, str]]:
    """The lines a duplicate is made of, white space folded: no blank, comment, import or lone bracket."""
    kept = []
    for i, line in enumerate(text.splitlines(), 1):
        s = " ".join(line.split())
        if s and not s.startswith(("#", "import ", "from ")) and not _THIN.match(s):
            kept.append((i, s))
    return kept


def _repeated_runs(files: dict[str, str]) -> list[str]:
    """Every pair of places where the same ``RUN`` kept lines stand, to the letter (a run in more
    than 8 places is too common to be one concept: left out, as `duplicates` does)."""
    where: dict[tuple[str, ...], list[tuple[str, int, int]]] = defaultdict(list)
    for name, text in files.items():
        kept = _kept(text)
        for k in range(len(kept) - RUN + 1):
            where[tuple(s for _, s in kept[k : k + RUN])].append((name, kept[k][0], kept[k + RUN - 1][0]))
    pairs = set()
    for places in where.values():
        if 2 <= len(places) <= 8:
            for a, (fa, sa, ea) in enumerate(places):
                for fb, sb, eb in places[a + 1 :]:
                    if fa != fb or ea < sb or eb < sa:  # not the same lines of one file
                        pairs.add(f"{fa}:{sa}-{ea} ~ {fb}:{sb}-{eb}")
    return sorted(pairs)


def test_no_six_lines_of_the_product_are_written_twice():
    """Runs of identical lines (the same code pasted): none. Runs of the same shape with other
    names (``duplicates --repo orchestrator``, the library's command) are counted in
    docs/architecture.md: they are mostly tables and signatures, and a look, not a rule."""
    files = {str(p.relative_to(ROOT)): p.read_text() for p in _modules(PRODUCT)}
    twice = _repeated_runs(files)
    assert not twice, f"the same {RUN} lines in two places (one function or table for both): {twice[:10]}"


def test_the_limits_see_what_they_claim_to():
    """The checks above read every module: a long function and an import from tests are found."""
    source = "def f():\n" + "    x = 1\n" * 70 + "\nfrom tests.conftest import ROOT\n"
    tree = ast.parse(source)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert (fn.end_lineno or 0) - fn.lineno + 1 == 71
    assert any(isinstance(n, ast.ImportFrom) and n.module == "tests.conftest" for n in ast.walk(tree))
    assert len(_modules(PRODUCT)) > 100 and any(p.name == "verdict.py" for p in _modules(PRODUCT))
    body = "".join(f"    total = total + item_{i} * weight\n" for i in range(6))
    one, other = f"def a():\n{body}    return 1\n", f"# pasted\n\ndef b():\n{body}    return 2\n"
    assert _repeated_runs({"one.py": one, "other.py": other}) == ["one.py:2-7 ~ other.py:4-9"]
    assert _repeated_runs({"one.py": one, "other.py": other.replace("item_3", "item_x")}) == []
