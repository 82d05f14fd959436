"""The house rules of docs/architecture.md, read from the source with ``ast`` (nothing is imported):

- each package imports only the layers below it, in the order the doc gives; the core never imports the agent;
- no import cycles between modules, counting the imports made inside functions;
- an import inside a function says why (``# function-level: ...``), unless it is the standard library's;
- every name a package re-exports lazily (``lazy_loader``) is defined where its table says;
- every module is listed in its package's docstring, the map a reader starts from;
- constructors take at most four positional parameters: the rest are keyword-only.
"""

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Lowest first: a layer may import itself and the layers before it, never one after it.
LAYERS = {
    "core": (
        "config",
        "runtime",
        "data",
        "model",
        "parallel",
        "optim",
        "memory",
        "perf",
        "ckpt",
        "trial",
        "training",
        ("train", "reference_rate", "sharded_checkpoint"),  # entry points: `python -m core.<name>`
    ),
    "autoresearch": (
        "records",
        "core_adapter",
        "space",
        "study",
        "search",
        "execute",
        "run",
        "report",
        "plan",
        "export",
        "cli",
        "agent",
    ),
}
MARKER = "function-level:"
MAX_POSITIONAL = 4  # self and three more


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (a name taken from a package resolves to its submodule)
    line: int
    function_level: bool
    marked: bool
    type_only: bool  # under ``if TYPE_CHECKING:``: never runs, so it cannot close a cycle


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _sources() -> dict[str, Path]:
    return {_module_name(p): p for top in LAYERS for p in sorted((ROOT / top).rglob("*.py"))}


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_sources()[module].read_text(), filename=str(_sources()[module]))


def _lazy_table(module: str) -> dict[str, str]:
    """``lazy_loader.attach``'s table in a package's ``__init__``: exported name -> the submodule that defines it."""
    table = {}
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "attach":
            for kw in node.keywords:
                value = ast.literal_eval(kw.value)
                if kw.arg == "submodules":
                    table.update({name: name for name in value})
                elif kw.arg == "submod_attrs":
                    table.update({name: sub for sub, names in value.items() for name in names})
    return table


def _resolve(package: str, name: str) -> str:
    """``from package import name``: the module that ``name`` comes from."""
    sources = _sources()
    if f"{package}.{name}" in sources:
        return f"{package}.{name}"
    if package in sources and name in _lazy_table(package):
        return f"{package}.{_lazy_table(package)[name]}"
    return package


def _top_level_nodes(tree: ast.Module) -> tuple[set[int], set[int]]:
    """Statements at module level (the body, and what its ``if``/``try`` blocks hold), and those of them under
    ``if TYPE_CHECKING:``."""
    top, type_only = set(), set()
    stack = [(node, False) for node in tree.body]
    while stack:
        node, typing_only = stack.pop()
        (type_only if typing_only else top).add(id(node))
        if isinstance(node, ast.If):
            guarded = typing_only or "TYPE_CHECKING" in ast.unparse(node.test)
            stack.extend((child, guarded) for child in node.body)
            stack.extend((child, typing_only) for child in node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend((child, typing_only) for child in ast.iter_child_nodes(node))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend((child, typing_only) for child in node.body)
    return top, type_only


def _is_marked(lines: list[str], lineno: int) -> bool:
    """The import's line, or the comment lines right above its block of imports, give the reason."""
    if MARKER in lines[lineno - 1]:
        return True
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith(("from ", "import ")):
        i -= 1
    while i >= 0 and lines[i].strip().startswith("#"):
        if MARKER in lines[i]:
            return True
        i -= 1
    return False


@cache
def _imports() -> tuple[Import, ...]:
    found = []
    for module, path in _sources().items():
        tree, lines = _tree(module), path.read_text().splitlines()
        top, type_only = _top_level_nodes(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against the importing package
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                targets = [_resolve(base, alias.name) for alias in node.names]
            else:
                continue
            inner = id(node) not in top and id(node) not in type_only
            marked = _is_marked(lines, node.lineno)
            found.extend(Import(module, t, node.lineno, inner, marked, id(node) in type_only) for t in targets)
    return tuple(found)


def _ours(target: str) -> bool:
    return target.split(".")[0] in LAYERS


def _layer(module: str) -> int:
    top, _, rest = module.partition(".")
    head = rest.split(".")[0]
    for rank, layer in enumerate(LAYERS[top]):
        if head == layer or (isinstance(layer, tuple) and head in layer):
            return rank
    return -1  # the package's own __init__


def test_every_module_has_a_layer():
    homeless = [m for m in _sources() if m not in LAYERS and _layer(m) < 0]
    assert not homeless, (
        f"modules outside the declared layers (add them to LAYERS and docs/architecture.md): {homeless}"
    )


def test_every_folder_of_code_is_a_package():
    folders = {p.parent for top in LAYERS for p in (ROOT / top).rglob("*.py")}
    namespace = sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").exists())
    assert not namespace, f"folders without an __init__.py (a docstring that maps the folder): {namespace}"


def test_imports_follow_the_layers():
    upward = []
    for imp in _imports():
        if not _ours(imp.target) or imp.target in LAYERS:
            continue
        src_top, dst_top = imp.source.split(".")[0], imp.target.split(".")[0]
        if src_top != dst_top:
            if src_top == "core":
                upward.append(f"{imp.source}:{imp.line} imports {imp.target}: the core never imports the agent")
            continue
        if _layer(imp.target) > _layer(imp.source):
            upward.append(f"{imp.source}:{imp.line} imports {imp.target}, a layer above it")
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for imp in _imports():
        if _ours(imp.target) and imp.target in _sources() and imp.target != imp.source and not imp.type_only:
            graph.setdefault(imp.source, set()).add(imp.target)
    # Tarjan's strongly connected components, iteratively: a component of more than one module is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(_sources()):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    assert not cycles, f"import cycles: {cycles}"


def test_function_level_imports_say_why():
    unmarked = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in _imports()
        if imp.function_level and imp.target.split(".")[0] not in sys.stdlib_module_names and not imp.marked
    ]
    assert not unmarked, f"function-level imports without a '# {MARKER} <why>' comment:\n" + "\n".join(unmarked)


def _defines(module: str, name: str) -> bool:
    for node in _tree(module).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
            if any(
                isinstance(t, ast.Tuple) and name in {e.id for e in t.elts if isinstance(e, ast.Name)} for t in targets
            ):
                return True
        if isinstance(node, ast.Import | ast.ImportFrom) and name in {a.asname or a.name for a in node.names}:
            return True
    return False


def _packages() -> list[str]:
    return [m for m, p in _sources().items() if p.name == "__init__.py"]


@pytest.mark.parametrize("package", _packages())
def test_lazy_exports_are_defined_where_their_table_says(package):
    missing = [
        f"{package}.{name} -> {package}.{sub}"
        for name, sub in _lazy_table(package).items()
        if name != sub and not _defines(f"{package}.{sub}", name)
    ]
    subpackages = [f"{package}.{sub}" for name, sub in _lazy_table(package).items() if name == sub]
    missing += [s for s in subpackages if s not in _sources()]
    assert not missing, f"lazy exports that name nothing: {missing}"


@pytest.mark.parametrize("package", _packages())
def test_package_docstring_lists_its_modules(package):
    doc = ast.get_docstring(_tree(package)) or ""
    folder = _sources()[package].parent
    children = [p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    children += [f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").exists()]
    unlisted = [c for c in sorted(children) if c not in doc]
    assert not unlisted, f"{package}'s docstring does not list {unlisted}"


def test_constructors_keep_positional_parameters_few():
    crowded = []
    for module in _sources():
        for node in ast.walk(_tree(module)):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    positional = len(item.args.posonlyargs) + len(item.args.args)
                    if positional > MAX_POSITIONAL:
                        crowded.append(f"{module}.{node.name}: {positional} positional parameters")
    assert not crowded, "make the later parameters keyword-only (after `*`):\n" + "\n".join(crowded)


def test_warm_server_preloads_modules_that_exist():
    from core.trial.fork_server import PRELOAD

    ours = [m for m in PRELOAD if _ours(m)]
    assert ours and all(m in _sources() for m in ours), ours


def test_statuses_are_compared_as_members():
    """A trial's status is a ``records.Status`` (or the core's ``Exit``) everywhere but ``records.py``: a string
    literal compared with one hides a misspelling ("compile-error") as a branch that is never taken."""
    from autoresearch.records import Status
    from core.trial.contract import STATUS

    spelled = {s.value for s in Status} | set(STATUS.values())
    literals = []
    for module in _sources():
        if module == "autoresearch.records":
            continue
        for node in ast.walk(_tree(module)):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    literals += [
                        f"{module}:{node.lineno}: {ast.unparse(node)}"
                        for c in ast.walk(side)
                        if isinstance(c, ast.Constant) and c.value in spelled
                    ]
    assert not literals, "compare with Status/Exit members:\n" + "\n".join(literals)


def _module_aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> our module, for ``import a.b as x`` and ``from a import b`` where ``a.b`` is a module."""
    from tests.unit.test_docs import _module_file

    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname: a.name for a in node.names if a.asname and _module_file(a.name) is not None}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and _ours(node.module):
            for a in node.names:
                if _module_file(f"{node.module}.{a.name}") is not None:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


@pytest.mark.parametrize("top", ["core", "autoresearch", "tests", "benchmarks"])
def test_module_attributes_exist(top):
    """``storage.REAP_REASON`` after ``from autoresearch.study import storage``: the attribute is defined in that
    module. A name that moved to a sibling module fails here, not minutes into an integration test."""
    from tests.unit.test_docs import _exists

    missing = []
    for path in sorted((ROOT / top).rglob("*.py")):
        tree = ast.parse(path.read_text())
        aliases = _module_aliases(tree)
        shadowed = {
            t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load):
                module = aliases.get(node.value.id)
                if module and node.value.id not in shadowed and not node.attr.startswith("__"):
                    if _exists(f"{module}.{node.attr}"):
                        continue
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr} ({module})")
    assert not missing, "\n".join(missing)


def test_benchmarks_and_tests_import_what_exists():
    """The benchmarks run outside the suite: an import a move broke would otherwise surface only when someone
    measures. Every import of ours in benchmarks/ and tests/, function-level ones included, names a module or a
    name defined in one."""
    from tests.unit.test_docs import _exists

    broken = []
    for top in ("benchmarks", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                broken += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if _ours(n) and not _exists(n)]
    assert not broken, "\n".join(broken)
