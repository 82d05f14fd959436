"""The docs name real code: every ``core/...`` or ``autoresearch/...`` path and every dotted ``core.x.y`` name in
the README, ``docs/``, the space and trial READMEs, the config files and the spaces exists (a module, or a name defined in
one). A move that forgets a doc fails here rather than misleading the next reader."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "search_spaces" / "README.md", ROOT / "trials" / "README.md"]
    + list((ROOT / "docs").glob("*.md"))
    + list((ROOT / "configs").rglob("*.yaml"))
    + list((ROOT / "search_spaces").glob("*.yaml"))
)
PATH = re.compile(r"(?<![\w./-])((?:core|autoresearch)/[\w/]*\w(?:\.\w+)?/?)")
DOTTED = re.compile(r"(?<![\w./-])((?:core|autoresearch)(?:\.\w+)+)")


def _module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _names(body: list[ast.stmt]) -> set[str]:
    names = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            for t in node.targets:
                if isinstance(t, ast.Tuple):
                    names |= {e.id for e in t.elts if isinstance(e, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If | ast.Try):
            names |= _names(node.body)
    return names


def _lazy_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "attach":
            for kw in node.keywords:
                value = ast.literal_eval(kw.value)
                names |= set(value) if kw.arg == "submodules" else {n for ns in value.values() for n in ns}
    return names


def _exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_file(".".join(parts[:cut]))
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        tree = ast.parse(path.read_text())
        if rest[0] not in _names(tree.body) | _lazy_names(tree):
            return False
        cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == rest[0]), None)
        return cls is None or len(rest) == 1 or rest[1] in _names(cls.body)
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_code_that_exists(doc):
    text = doc.read_text()
    missing = [p for p in sorted(set(PATH.findall(text))) if not (ROOT / p.rstrip("/")).exists()]
    missing += [d for d in sorted(set(DOTTED.findall(text))) if not _exists(d.rstrip("."))]
    assert not missing, f"{doc.relative_to(ROOT)} names code that does not exist: {missing}"


def _ext_modules() -> set[str]:
    """Extension modules ``pip install`` builds (pyproject.toml): names with no .py file behind them."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {ext["name"] for ext in project["tool"]["setuptools"].get("ext-modules", [])}


def _prose(path: Path) -> str:
    """A Python file's comments and strings (docstrings included): where code names other code in words."""
    import io
    import tokenize

    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return "\n".join(t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING))


CODE = sorted(
    p
    for top in ("core", "autoresearch", "tests", "benchmarks")
    for p in (ROOT / top).rglob("*.py")
    if p != Path(__file__).resolve()
)


@pytest.mark.parametrize("path", [*CODE, ROOT / "benchmarks" / "RESULTS.md"], ids=lambda p: str(p.relative_to(ROOT)))
def test_comments_and_docstrings_name_code_that_exists(path):
    text = path.read_text() if path.suffix == ".md" else _prose(path)
    missing = [p for p in sorted(set(PATH.findall(text))) if not (ROOT / p.rstrip("/")).exists()]
    missing += [d for d in sorted(set(DOTTED.findall(text))) if d not in _ext_modules() and not _exists(d.rstrip("."))]
    assert not missing, f"{path.relative_to(ROOT)} names code that does not exist: {missing}"
