"""The architecture, checked by reading the source with `ast` (nothing here imports hogwild).

1. Layers, lowest first (LAYERS): a module imports its own layer or lower, so each layer can be
   understood, tested and reused without the ones above. Named cases (FORBIDDEN): workers never
   import the orchestrator; data, models and workloads never import the orchestration.
2. hydra and omegaconf only in hogwild.cli: the library works without its CLI.
3. No import cycles between hogwild modules: with one, import order decides what works.
4. No mutable module-level state: no `global`; a module-level name is a constant (ALL_CAPS, an
   inert value, never mutated anywhere), a type alias (CapWords) or a logger; no module assigns
   another's attributes. State lives in objects passed around, so runs sharing a process
   (sweeps, tests, the Python API) cannot leak into each other.
5. Tests use public seams: no `module._name` nor `from hogwild.x import _name` under tests/.
6. docs/design.md names every module, and every module it names exists (convention: doc_map).

Every import counts: top level, in functions, under `if TYPE_CHECKING:`. `from p import n`
imports p.n when that is a module, else p; relative imports are resolved; the parent packages
that importing p.n runs are not counted. Each rule is a function of {module: source}, also run
on a small synthetic package that breaks it, so a rule that cannot fail shows up here.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAYERS = {"errors": 0, "cadence": 0, "data": 1, "models": 1, "config": 1, "process": 2}
LAYERS |= {"reporting": 2, "optim": 2, "protocol": 2, "workloads": 3, "worker": 4}
LAYERS |= {"distributed": 4, "run": 5, "bench": 6, "cli": 7, "__main__": 8}  # hogwild: 8
ORCHESTRATOR = ("hogwild.run", "hogwild.cli", "hogwild.bench")
ORCHESTRATION = (*ORCHESTRATOR, "hogwild.worker", "hogwild.distributed")
# Calls a module-level name may be bound to: a handle on logging's own registry, a type variable.
# An ALL_CAPS constant may also call what builds an immutable value (re.compile, frozenset,
# tuple, MappingProxyType), a type (namedtuple), or a container display spelled as a call
# (dict(a=1), list(T)), which, like {} and [], is then held to never being mutated. Not
# os.environ.get & co (reading the environment at import time freezes it), nor any class.
HANDLES = {"logging.getLogger", "TypeVar", "typing.TypeVar"}
CALLS = HANDLES | {"re.compile", "frozenset", "tuple", "dict", "list", "set", "namedtuple"}
CALLS |= {"collections.namedtuple", "types.MappingProxyType", "MappingProxyType"}
MUTATORS = {"append", "extend", "insert", "remove", "pop", "popitem", "clear", "update", "add"}
MUTATORS |= {"setdefault", "discard", "sort", "reverse", "__setitem__", "__delitem__"}
CAPS, CAPWORDS = re.compile(r"_*[A-Z][A-Z0-9_]*"), re.compile(r"_*[A-Z]\w*[a-z]\w*")


def load(folder: str) -> dict[str, str]:
    """{dotted module name: source} for every .py file under REPO/folder."""
    out = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path.read_text()
    return out


@functools.cache
def parse(source: str) -> ast.Module:
    return ast.parse(source)  # read-only here, so shared


def under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer(module: str) -> int | None:
    parts = module.split(".")
    return 8 if parts == ["hogwild"] else LAYERS.get(parts[1]) if parts[0] == "hogwild" else None


def imports(module: str, source: str, modules) -> list[tuple[str, int, str, str]]:
    """(module imported, line, name bound, dotted name it is bound to), every import in source."""
    package = any(m.startswith(module + ".") for m in modules)  # a package has submodules
    out = []
    for node in ast.walk(parse(source)):
        for a in node.names if isinstance(node, ast.Import) else []:
            bound = (a.asname, a.name) if a.asname else (a.name.split(".")[0],) * 2
            out.append((a.name, node.lineno, *bound))
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: None if package else -1]
                parts = parts[: len(parts) - node.level + 1] + [base] * bool(base)
                base = ".".join(parts)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub if sub in modules else base, node.lineno, a.asname or a.name, sub))
    return out


def edges(module: str, source: str, modules) -> dict[tuple[str, int], None]:
    """The (module imported, line) pairs of `source`, each once, in order."""
    return dict.fromkeys((target, line) for target, line, *_ in imports(module, source, modules))


def by_line(violation: str) -> tuple[str, int]:
    module, line = re.match(r"([\w.]+):(\d+)", violation).groups()
    return module, int(line)


def layering(sources: dict[str, str]) -> list[str]:
    out = [f"{m}: not in LAYERS (rule 1)" for m in sources if layer(m) is None]
    for m, source in sources.items():
        for target, line in edges(m, source, sources):
            if layer(m) is not None and under(target, ["hogwild"]):
                if layer(target) is None or layer(target) > layer(m):
                    out.append(f"{m}:{line} imports {target} (layer {layer(target)}) from layer "
                               f"{layer(m)} (rule 1: imports go down the layers)")  # fmt: skip
    return out


def forbidden(sources: dict[str, str], importers, targets, rule: str) -> list[str]:
    return [
        f"{m}:{line} imports {target} ({rule})"
        for m, source in sources.items()
        if importers(m)
        for target, line in edges(m, source, sources)
        if under(target, targets)
    ]


def cycles(sources: dict[str, str]) -> list[str]:
    """Each set of modules that import each other, with the imports (module:line) inside it."""
    graph = {m: {} for m in sources}
    for m, source in sources.items():
        for target, line in edges(m, source, sources):
            if target in sources and target != m:
                graph[m].setdefault(target, line)
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            todo += [t for t in graph[todo.pop()] if t not in seen and not seen.add(t)]
        reach[start] = seen
    found = {frozenset(n for n in reach[m] if m in reach[n]) for m in graph if m in reach[m]}
    return [
        f"rule 3, import cycle {sorted(c)}: "
        + ", ".join(f"{m}:{ln} -> {t}" for m in sorted(c) for t, ln in graph[m].items() if t in c)
        for c in sorted(found, key=sorted)
    ]


def resolve(e: ast.expr, bound: dict[str, str]) -> str:
    """The dotted name `e` stands for, its first name looked up in `bound` (name -> dotted)."""
    first, *rest = ast.unparse(e).split(".")
    return ".".join([bound.get(first, "?" + first), *rest])


def module_level(body):
    """(name, value, line) of each module-level binding, in if/try/with blocks too."""
    for node in body:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value:
            targets = [*node.targets] if isinstance(node, ast.Assign) else [node.target]
            while targets:  # names, unpacking included; not x.y = nor x[k] =
                t = targets.pop()
                if isinstance(t, ast.Name):
                    yield t.id, node.value, node.lineno
                targets += [t.value] if isinstance(t, ast.Starred) else getattr(t, "elts", [])
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                yield from module_level(getattr(node, block, []))


def allowed(name: str, value: ast.expr) -> bool:
    calls = {ast.unparse(n.func) for n in ast.walk(value) if isinstance(n, ast.Call)}
    if CAPS.fullmatch(name) or name.startswith("__"):  # a constant; never mutated: below
        return calls <= CALLS and not any(isinstance(n, ast.Lambda) for n in ast.walk(value))
    if CAPWORDS.fullmatch(name):  # a type alias
        return not calls and isinstance(value, (ast.Subscript, ast.BinOp, ast.Name, ast.Attribute))
    return isinstance(value, ast.Call) and ast.unparse(value.func) in HANDLES and calls <= CALLS


def module_state(sources: dict[str, str]) -> list[str]:
    trees = {m: parse(s) for m, s in sources.items()}
    names = {m: {n for n, _, _ in module_level(t.body)} for m, t in trees.items()}
    out = []
    for m, tree in trees.items():
        out += [
            f"{m}:{line} module-level `{name} = {ast.unparse(value)[:60]}` (rule 4: only "
            "ALL_CAPS constants, CapWords type aliases, loggers)"
            for name, value, line in module_level(tree.body)
            if not allowed(name, value)
        ]
        bound = {n: f"{m}.{n}" for n in names[m]}
        bound |= {b: to for _, _, b, to in imports(m, sources[m], sources)}

        def held(e, bound=bound):
            """`hogwild.x.NAME` when e is a module-level name of a hogwild module, else None."""
            full = resolve(e, bound)
            module, _, name = full.rpartition(".")
            return full if name in names.get(module, ()) and full not in names else None

        for node in ast.walk(tree):
            what = f"`global {', '.join(node.names)}`" if isinstance(node, ast.Global) else None
            for t in getattr(node, "targets", [getattr(node, "target", None)]):  # =, +=, del
                if isinstance(t, ast.Attribute) and resolve(t.value, bound) in names:
                    what = f"assigns {resolve(t, bound)}, an attribute of a module"
                elif isinstance(t, (ast.Subscript, ast.Attribute)) and held(t.value):
                    what = f"mutates {held(t.value)}"
            f = node.func if isinstance(node, ast.Call) else None
            if isinstance(f, ast.Attribute) and f.attr in MUTATORS and held(f.value):
                what = f"mutates {held(f.value)} (.{f.attr})"
            if what:
                out.append(f"{m}:{node.lineno} {what} (rule 4: no mutable module state)")
    return sorted(out, key=by_line)


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_access(tests: dict[str, str], modules) -> list[str]:
    out = []
    for test, source in tests.items():
        found = imports(test, source, modules)
        bound = {b: to for _, _, b, to in found}
        out += [f"{test}:{line} imports {to}" for _, line, _, to in found
                if under(to, ["hogwild"]) and any(map(private, to.split(".")))]  # fmt: skip
        for node in ast.walk(parse(source)):
            hit = None
            if isinstance(node, ast.Attribute) and private(node.attr):
                hit = resolve(node, bound) if resolve(node.value, bound) in modules else None
            elif isinstance(node, ast.Call) and node.args:  # setattr(m, "_x"), patch("hogwild._x")
                first, second = node.args[0], [*node.args[1:2], None][0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    parts = first.value.split(".")
                    hit = first.value if parts[0] == "hogwild" and private(parts[-1]) else None
                elif isinstance(second, ast.Constant) and private(str(second.value)):
                    module = resolve(first, bound)
                    hit = f"{module}.{second.value}" if module in modules else None
            if hit:
                out.append(f"{test}:{node.lineno} uses {hit}")
    return [f"{v} (rule 5: tests use public names only)" for v in sorted(out, key=by_line)]


FOLDER_LINE = re.compile(r"[\s`*-]*(hogwild/(?:\w+/)*)")
PATH = re.compile(r"(?<![\w/.-])hogwild/(?:\w+/)*\w+\.py")
FOLDER = re.compile(r"(?<![\w/.-])hogwild/(?:\w+/)+(?!\w)")
BASENAME = re.compile(r"(?<![\w/.-])\w+\.py\b")


def doc_map(doc: str, files: set[str]) -> list[str]:
    """The convention of docs/design.md: a module hogwild/a/b.py is named by its path, literally,
    or by `b.py` on a line that begins (after spaces, `-`, `*`, backticks) with a path in
    hogwild/a/: "hogwild/run/  the run: trainer.py, loop.py" or "hogwild/x.py, y.py"; a
    package (its __init__.py) by its folder, literally: `hogwild/run/`. Every hogwild/ path named,
    and every b.py on such a line, must exist. `files`: repo-relative paths of the .py files."""
    named = set(PATH.findall(doc)) | set(FOLDER.findall(doc))
    for line in doc.splitlines():
        if folder := FOLDER_LINE.match(line):
            named |= {folder[1] + b for b in BASENAME.findall(line)}
    wanted = {f.removesuffix("__init__.py") for f in files} - {"hogwild/"}
    return [f"{f} is not named in docs/design.md (rule 6)" for f in sorted(wanted - named)] + [
        f"docs/design.md names {f}, which does not exist (rule 6)"
        for f in sorted(named - wanted - {"hogwild/"})
    ]


HOGWILD = load("hogwild")
FORBIDDEN = {  # rule: (which modules, what they must not import)
    "rule 1: workers never import the orchestrator": (
        lambda m: under(m, ["hogwild.worker"]),
        ORCHESTRATOR,
    ),
    "rule 1: data, models and workloads never import the orchestration": (
        lambda m: under(m, ["hogwild.data", "hogwild.models", "hogwild.workloads"]),
        ORCHESTRATION,
    ),
    "rule 2: hydra and omegaconf only in hogwild.cli": (
        lambda m: not under(m, ["hogwild.cli"]),
        ("hydra", "omegaconf"),
    ),
}


def test_every_module_has_a_layer_and_imports_go_down_the_layers():
    assert not layering(HOGWILD), "\n".join(layering(HOGWILD))


@pytest.mark.parametrize("rule", FORBIDDEN)
def test_forbidden_imports(rule):
    found = forbidden(HOGWILD, *FORBIDDEN[rule], rule)
    assert not found, "\n".join(found)


def test_no_import_cycles():
    assert not cycles(HOGWILD), "\n".join(cycles(HOGWILD))


def test_no_mutable_module_state():
    assert not module_state(HOGWILD), "\n".join(module_state(HOGWILD))


def test_tests_use_public_seams():
    tests = {m: s for m, s in load("tests").items() if m != "tests.unit.test_layout"}
    found = private_access(tests, set(HOGWILD))
    assert not found, "\n".join(found)


def test_the_design_doc_names_every_module_and_only_modules_that_exist():
    files = {str(p.relative_to(REPO)) for p in (REPO / "hogwild").rglob("*.py")}
    found = doc_map((REPO / "docs" / "design.md").read_text(), files)
    assert not found, "\n".join(found)


# The rules on a small synthetic package that breaks each of them.
FAKE = {
    "hogwild": "from hogwild import run",
    "hogwild.errors": "from hogwild import __version__\nfrom . import cli\n",
    "hogwild.data": "",
    "hogwild.data.base": "def f():\n    from ..worker.main import g\n",
    "hogwild.worker": "",
    "hogwild.worker.main": "import typing\nif typing.TYPE_CHECKING:\n    import hogwild.run as r\n",
    "hogwild.run": "from hogwild.run.loop import *\nimport omegaconf\n",
    "hogwild.run.loop": "from hogwild.run import x\n",
    "hogwild.cli": "import hydra\nfrom hogwild import run, data",
    "hogwild.extra": "",
}


def test_the_import_rules_catch_violations():
    assert [v.split(" (rule")[0] for v in layering(FAKE)] == [
        "hogwild.extra: not in LAYERS",
        "hogwild.errors:1 imports hogwild (layer 8) from layer 0",
        "hogwild.errors:2 imports hogwild.cli (layer 7) from layer 0",  # relative
        "hogwild.data.base:2 imports hogwild.worker.main (layer 4) from layer 1",  # in a function
        "hogwild.worker.main:3 imports hogwild.run (layer 5) from layer 4",  # TYPE_CHECKING
    ]
    assert [
        v.split(" (rule")[0] for rule in FORBIDDEN for v in forbidden(FAKE, *FORBIDDEN[rule], rule)
    ] == [
        "hogwild.worker.main:3 imports hogwild.run",
        "hogwild.data.base:2 imports hogwild.worker.main",
        "hogwild.run:2 imports omegaconf",
    ]
    assert cycles(FAKE) == [
        "rule 3, import cycle ['hogwild.run', 'hogwild.run.loop']: "
        "hogwild.run:1 -> hogwild.run.loop, hogwild.run.loop:1 -> hogwild.run"
    ]


def test_the_state_rule_catches_violations():
    ok = "import logging, re\nlog = logging.getLogger('x')\nKEY = re.compile('k')\n"
    ok += "State = dict[str, int]\nGROUPS = {'a': int}\nMODELS = (*GROUPS, 'b')\n__all__ = ['f']\n"
    bad = "_held = {}\nflag = False\n_RECEIVER = Receiver()\nITEMS = []\n"
    bad += "def f():\n    global flag\n    ITEMS.append(1)\n    del _held['a']\n"
    other = "from hogwild import a\nfrom hogwild.a import ITEMS as I\n"
    other += "a.ITEMS[0] = 1\na.flag = True\nI.clear()\n"
    found = module_state({"hogwild": "", "hogwild.ok": ok, "hogwild.a": bad, "hogwild.b": other})
    assert [v.split(" (rule")[0] for v in found] == [
        "hogwild.a:1 module-level `_held = {}`",
        "hogwild.a:2 module-level `flag = False`",
        "hogwild.a:3 module-level `_RECEIVER = Receiver()`",
        "hogwild.a:6 `global flag`",
        "hogwild.a:7 mutates hogwild.a.ITEMS (.append)",
        "hogwild.a:8 mutates hogwild.a._held",
        "hogwild.b:3 mutates hogwild.a.ITEMS",
        "hogwild.b:4 assigns hogwild.a.flag, an attribute of a module",
        "hogwild.b:5 mutates hogwild.a.ITEMS (.clear)",
    ]


def test_the_seams_and_doc_rules_catch_violations():
    tests = "from hogwild.process import signals\nimport hogwild.run.folder as f\n"
    tests += "from hogwild.cli.job import _FINISHED, run_job\nsignals._RECEIVER\nf.Claim\n"
    tests += "monkeypatch.setattr(f, '_held', {})\npatch('hogwild.run.folder._held')\nx._y\n"
    modules = {"hogwild", "hogwild.process.signals", "hogwild.run.folder", "hogwild.cli.job"}
    assert [v.split(" (rule")[0] for v in private_access({"t": tests}, modules)] == [
        "t:3 imports hogwild.cli.job._FINISHED",
        "t:4 uses hogwild.process.signals._RECEIVER",
        "t:6 uses hogwild.run.folder._held",
        "t:7 uses hogwild.run.folder._held",
    ]
    files = {"hogwild/__init__.py", "hogwild/cadence.py", "hogwild/run/__init__.py"}
    files |= {"hogwild/cli/__init__.py", "hogwild/run/loop.py", "hogwild/cli/main.py"}
    doc = "- `hogwild/cadence.py`: timing\n`hogwild/run/` the run: loop.py, gone.py\n"
    doc += "hogwild/old.py and hogwild/cli/\nsee main.py\n"
    assert doc_map(doc, files) == [
        "hogwild/cli/main.py is not named in docs/design.md (rule 6)",
        "docs/design.md names hogwild/old.py, which does not exist (rule 6)",
        "docs/design.md names hogwild/run/gone.py, which does not exist (rule 6)",
    ]
