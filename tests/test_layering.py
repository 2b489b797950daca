"""Import contracts: the layering rules of DESIGN.md ("Shape of the code"), checked on the source.

Every module under ``zephon/`` and ``adapters/`` is parsed with ``ast`` (never imported, so a module that would
fail to import is still checked). The whole tree is walked, so imports inside functions (lazy imports) and
``importlib.import_module("literal")`` calls count like top-level ones; relative imports are resolved against the
importing module's package. ``from pkg import name`` counts as importing the submodule ``pkg.name`` when that is a
module, else as importing ``pkg`` itself.

Rules (a layer is ``zephon.<layer>``, any depth below it; imports inside one's own layer are always allowed):
- ``formats`` imports nothing else of zephon (leaves);
- ``work`` may import ``formats`` only (never ``ops``, ``engine``, ``host``: pointer streams know nothing of data or
  runtime);
- ``ops`` may import ``work`` and ``formats`` (never ``engine``, ``host``: operators are driven, they do not drive);
- ``checkpoint`` may import ``formats`` only (its atomic-write helper; never ``engine``, ``host``, ``ops``, ``work``);
- ``engine`` may import ``work``, ``ops``, ``checkpoint``, ``formats``;
- ``host`` may import ``engine``, ``checkpoint``, ``work``, ``ops``, ``formats``;
- no layer imports the ``zephon`` facade (``zephon/__init__``) or the tools beside the layers (``cli``, ``verify``,
  ...): those sit on top and import the layers;
- nothing in ``zephon/`` imports an adapter package; adapters never import each other;
- adapters import from zephon only ``zephon``, ``zephon.host``, ``zephon.formats``, ``zephon.ops``, ``zephon.work``
  (any depth) and the package-level ``zephon.checkpoint``: never ``zephon.engine`` nor a submodule of
  ``zephon.checkpoint`` (they go through ``host``, so no adapter reimplements engine or checkpoint logic).

Each rule has a negative test: a synthetic module with a forbidden import, which the checker must report.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORE = "zephon"
ADAPTER_DIR = "adapters"
# The adapter packages named by DESIGN.md; any other package found under adapters/ is one too.
KNOWN_ADAPTERS = ("zephon_torch", "zephon_streaming", "zephon_energon")
LAYERS = ("formats", "work", "ops", "checkpoint", "engine", "host")
MAY_IMPORT = {
    "formats": frozenset(),
    "work": frozenset({"formats"}),
    "ops": frozenset({"work", "formats"}),
    "checkpoint": frozenset({"formats"}),
    "engine": frozenset({"work", "ops", "checkpoint", "formats"}),
    "host": frozenset({"engine", "checkpoint", "work", "ops", "formats"}),
}
# What an adapter may import from the core: these modules and everything below them ...
ADAPTER_MAY_IMPORT_TREE = ("zephon.host", "zephon.formats", "zephon.ops", "zephon.work")
# ... and these modules exactly (package level only: zephon.checkpoint.<x> is an internal).
ADAPTER_MAY_IMPORT_EXACT = ("zephon", "zephon.checkpoint")


@dataclass(frozen=True)
class Import:
    """One import found in a module: ``importer`` (dotted module name, file ``path`` relative to the repo, ``line``)
    imports the absolute dotted module ``target``."""
    path: str
    line: int
    importer: str
    target: str


def module_name(rel_path: str) -> tuple[str, bool]:
    """(dotted module name, is a package ``__init__``) of a repo-relative ``.py`` path; adapters live one level down
    (``adapters/zephon_torch/x.py`` is ``zephon_torch.x``)."""
    parts = list(Path(rel_path).with_suffix("").parts)
    if parts[0] == ADAPTER_DIR:
        parts = parts[1:]
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def module_exists(dotted: str, root: Path = REPO) -> bool:
    """Whether ``dotted`` names a module or package in the repo. A core layer counts as one even before its package
    exists (``zephon.host`` is being created), so ``from zephon import host`` is seen as importing that layer."""
    parts = dotted.split(".")
    if len(parts) == 2 and parts[0] == CORE and parts[1] in LAYERS:
        return True
    base = root if parts[0] == CORE else root / ADAPTER_DIR
    path = base.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute module of ``from <level dots><module> import ...`` written in ``importer``."""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    if level - 1 > len(package) - 1:
        raise ValueError(f"relative import beyond the top-level package in {importer}")
    base = package[:len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _literal_import_call(node: ast.Call) -> str | None:
    """The module of ``importlib.import_module("m")`` / ``import_module("m")`` / ``__import__("m")`` with a literal
    absolute name; None otherwise (a computed name cannot be checked statically)."""
    fn = node.func
    name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and not arg.value.startswith("."):
        return arg.value
    return None


def imports_of(source: str, rel_path: str, exists=module_exists) -> list[Import]:
    """Every import in ``source`` (the text of repo-relative ``rel_path``), lazy ones included, as absolute targets.

    ``exists(dotted)`` says whether a name is a module (for ``from pkg import name``)."""
    importer, is_package = module_name(rel_path)
    out = []
    for node in ast.walk(ast.parse(source, filename=rel_path)):
        if isinstance(node, ast.Import):
            out.extend(Import(rel_path, node.lineno, importer, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(importer, is_package, node.level, node.module) if node.level else node.module
            if base == "__future__":
                continue
            submodules = [f"{base}.{a.name}" for a in node.names if a.name != "*" and exists(f"{base}.{a.name}")]
            # Names that are not modules are attributes of ``base``: that import is of ``base`` itself.
            targets = submodules + ([base] if len(submodules) < len(node.names) else [])
            out.extend(Import(rel_path, node.lineno, importer, t) for t in targets)
        elif isinstance(node, ast.Call):
            target = _literal_import_call(node)
            if target:
                out.append(Import(rel_path, node.lineno, importer, target))
    return out


def adapter_packages(root: Path = REPO) -> tuple[str, ...]:
    """The adapter import packages: those DESIGN.md names plus every package directory under ``adapters/``."""
    found = {p.parent.name for p in (root / ADAPTER_DIR).glob("*/__init__.py")}
    return tuple(sorted(found | set(KNOWN_ADAPTERS)))


def scan(root: Path = REPO) -> list[Import]:
    """Imports of every ``.py`` file under ``zephon/`` and ``adapters/`` of the working tree."""
    out = []
    for top in (CORE, ADAPTER_DIR):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            out.extend(imports_of(path.read_text(encoding="utf-8"), rel, exists=lambda name: module_exists(name, root)))
    return out


# ---------------------------------------------------------------- rules


def _top(dotted: str) -> str:
    return dotted.split(".", 1)[0]


def _layer(dotted: str) -> str | None:
    """``zephon.<x>...`` -> ``x`` (a layer or a tool module such as ``cli``); ``zephon`` itself -> ``"zephon"`` (the
    facade); anything outside the core -> None."""
    parts = dotted.split(".")
    if parts[0] != CORE:
        return None
    return parts[1] if len(parts) > 1 else CORE


def _report(imp: Import, why: str) -> str:
    return f"{imp.path}:{imp.line}: {imp.importer} imports {imp.target} ({why})"


def layer_violations(imports: list[Import]) -> list[str]:
    """Imports by a core layer of a core module its layer may not use (``MAY_IMPORT``)."""
    out = []
    for imp in imports:
        own = _layer(imp.importer)
        if own not in MAY_IMPORT:
            continue
        used = _layer(imp.target)
        if used is None or used == own or used in MAY_IMPORT[own]:
            continue
        allowed = ", ".join(sorted(MAY_IMPORT[own])) or "nothing else of zephon"
        out.append(_report(imp, f"{own} may import only {allowed}"))
    return out


def core_adapter_violations(imports: list[Import], adapters=KNOWN_ADAPTERS) -> list[str]:
    """Imports of an adapter package by anything in ``zephon/``."""
    return [_report(imp, "the core never imports an adapter") for imp in imports
            if _top(imp.importer) == CORE and _top(imp.target) in adapters]


def cross_adapter_violations(imports: list[Import], adapters=KNOWN_ADAPTERS) -> list[str]:
    """Imports of one adapter package by another."""
    return [_report(imp, "adapters never import each other") for imp in imports
            if _top(imp.importer) in adapters and _top(imp.target) in adapters
            and _top(imp.target) != _top(imp.importer)]


def adapter_core_violations(imports: list[Import], adapters=KNOWN_ADAPTERS) -> list[str]:
    """Imports by an adapter of a core module outside its public surface (``ADAPTER_MAY_IMPORT_*``)."""
    out = []
    for imp in imports:
        if _top(imp.importer) not in adapters or _top(imp.target) != CORE:
            continue
        t = imp.target
        if t in ADAPTER_MAY_IMPORT_EXACT or any(t == m or t.startswith(m + ".") for m in ADAPTER_MAY_IMPORT_TREE):
            continue
        out.append(_report(imp, "adapters use zephon, zephon.host, formats, ops, work and the zephon.checkpoint "
                                "package, never engine or checkpoint internals"))
    return out


# ---------------------------------------------------------------- the working tree


@pytest.fixture(scope="module")
def tree_imports() -> list[Import]:
    return scan()


def test_scan_sees_the_tree(tree_imports):
    """Guards against a vacuous pass: the scan finds the core layers, the adapters and their imports of zephon."""
    importers = {_layer(i.importer) for i in tree_imports}
    assert {"formats", "work", "ops", "engine"} <= importers
    assert {_top(i.importer) for i in tree_imports} >= {CORE, *KNOWN_ADAPTERS}
    # The core imports itself relatively: those resolve to zephon.<layer> targets across layers.
    crossing = {(_layer(i.importer), _layer(i.target)) for i in tree_imports
                if _top(i.importer) == CORE and _top(i.target) == CORE and _layer(i.importer) != _layer(i.target)}
    assert len(crossing) >= 5, crossing
    for adapter in KNOWN_ADAPTERS:
        assert any(_top(i.importer) == adapter and _top(i.target) == CORE for i in tree_imports), adapter


def test_core_layers(tree_imports):
    """formats, work, ops, checkpoint, engine and host import only the layers DESIGN.md lets them use."""
    assert layer_violations(tree_imports) == []


def test_core_never_imports_an_adapter(tree_imports):
    assert core_adapter_violations(tree_imports, adapter_packages()) == []


def test_adapters_never_import_each_other(tree_imports):
    assert cross_adapter_violations(tree_imports, adapter_packages()) == []


def test_adapters_use_only_the_public_core(tree_imports):
    assert adapter_core_violations(tree_imports, adapter_packages()) == []


# ---------------------------------------------------------------- the checker can fail


# Modules the synthetic sources name: some do not exist yet (zephon.host, zephon.checkpoint are being created),
# others will go (zephon.engine.checkpoint); the negative tests must not depend on the tree of the day.
SYNTHETIC_MODULES = frozenset({"zephon.engine.checkpoint", "zephon.engine.stage", "zephon.checkpoint.schema",
                               "zephon.checkpoint.merge", "zephon.host.workers", "zephon.ops.pack"})


def _check(rule, rel_path: str, source: str) -> list[str]:
    return rule(imports_of(source, rel_path, exists=lambda name: name in SYNTHETIC_MODULES or module_exists(name)))


@pytest.mark.parametrize("rel_path,source,target", [
    # formats are leaves
    ("zephon/formats/jsonl.py", "from ..work import WorkSource\n", "zephon.work"),
    ("zephon/formats/__init__.py", "from .. import ops\n", "zephon.ops"),
    ("zephon/formats/mds/reader.py", "import zephon.engine.lane\n", "zephon.engine.lane"),
    # work never imports ops, engine, host (a lazy import inside a function)
    ("zephon/work/source.py", "def f():\n    from ..ops.pack import Pack\n", "zephon.ops.pack"),
    ("zephon/work/source.py", "from zephon.engine import Loader\n", "zephon.engine"),
    ("zephon/work/lanes.py", "from zephon.host import workers\n", "zephon.host.workers"),
    # ops never import engine, host
    ("zephon/ops/pack.py", "from ..engine.stage import error_for\n", "zephon.engine.stage"),
    ("zephon/ops/__init__.py", "from ..host import x\n", "zephon.host"),
    # checkpoint never imports engine, host, ops, work
    ("zephon/checkpoint/schema.py", "from ..engine import Loader\n", "zephon.engine"),
    ("zephon/checkpoint/merge.py", "from ..work.permute import derive_key\n", "zephon.work.permute"),
    ("zephon/checkpoint/__init__.py", "from .. import host\n", "zephon.host"),
    # engine never imports host, nor the facade on top of it
    ("zephon/engine/loader.py", "from ..host.workers import worker_lanes\n", "zephon.host.workers"),
    ("zephon/engine/loader.py", "import importlib\nimportlib.import_module('zephon.host')\n", "zephon.host"),
    ("zephon/engine/loader.py", "from .. import Loader\n", "zephon"),
    # host never imports the tools on top (cli)
    ("zephon/host/workers.py", "def f():\n    from ..cli import main\n", "zephon.cli"),
])
def test_layer_rule_reports_a_forbidden_import(rel_path, source, target):
    found = _check(layer_violations, rel_path, source)
    assert len(found) == 1 and f" imports {target} (" in found[0], found


@pytest.mark.parametrize("rel_path,source", [
    ("zephon/formats/jsonl.py", "from .errors import DataError\nimport numpy\n"),
    ("zephon/ops/shuffle.py", "from ..work.permute import mix64\nfrom ..formats import DataError\n"),
    ("zephon/checkpoint/schema.py", "from ..formats.fileio import atomic_write\n"),
    ("zephon/engine/loader.py", "from ..checkpoint import merge_states\nfrom . import lane\n"),
    ("zephon/host/workers.py", "from ..engine import Loader\nfrom ..checkpoint import schema\n"),
    ("zephon/cli.py", "from .engine import Loader\nfrom .verify import format_table\n"),
])
def test_layer_rule_accepts_allowed_imports(rel_path, source):
    assert _check(layer_violations, rel_path, source) == []


@pytest.mark.parametrize("rel_path,source", [
    ("zephon/engine/loader.py", "import zephon_torch\n"),
    ("zephon/host/workers.py", "def f():\n    from zephon_energon.loader import SavableDataLoader\n"),
    ("zephon/cli.py", "import importlib\nimportlib.import_module('zephon_streaming.dataset')\n"),
])
def test_core_adapter_rule_reports_a_forbidden_import(rel_path, source):
    assert len(_check(core_adapter_violations, rel_path, source)) == 1


@pytest.mark.parametrize("rel_path,source", [
    ("adapters/zephon_torch/loader.py", "from zephon_energon import WorkerConfig\n"),
    ("adapters/zephon_energon/dataset.py", "def f():\n    import zephon_streaming.dataset\n"),
])
def test_cross_adapter_rule_reports_a_forbidden_import(rel_path, source):
    assert len(_check(cross_adapter_violations, rel_path, source)) == 1


def test_cross_adapter_rule_accepts_own_package():
    assert _check(cross_adapter_violations, "adapters/zephon_energon/megatron.py",
                  "from . import WorkerConfig\nfrom .dataset import EnergonDataset\n") == []


@pytest.mark.parametrize("source,target", [
    ("from zephon.engine import Loader\n", "zephon.engine"),
    ("def f():\n    from zephon.engine import checkpoint as ckpt\n", "zephon.engine.checkpoint"),
    ("from zephon import engine\n", "zephon.engine"),
    ("from zephon.checkpoint.schema import LaneCursor\n", "zephon.checkpoint.schema"),
    ("import zephon.checkpoint.merge\n", "zephon.checkpoint.merge"),
    ("from zephon.dist import gather_checkpoint\n", "zephon.dist"),
])
def test_adapter_core_rule_reports_a_forbidden_import(source, target):
    found = _check(adapter_core_violations, "adapters/zephon_torch/loader.py", source)
    assert len(found) == 1 and f" imports {target} (" in found[0], found


def test_adapter_core_rule_accepts_the_public_surface():
    source = ("from zephon import Loader, checkpoint\nfrom zephon.host import Reassembly\n"
              "from zephon.checkpoint import merge_states\nfrom zephon.formats.energon import open_energon\n"
              "from zephon.ops.tokenize import load_tokenizer\nfrom zephon.work import split_lanes\n")
    assert _check(adapter_core_violations, "adapters/zephon_streaming/dataset.py", source) == []


def test_relative_imports_resolve_against_the_package():
    """``__init__`` is its own package; a plain module's package is its parent."""
    found = {i.target for i in imports_of("from . import a\nfrom .. import b\nfrom .c import d\n",
                                          "zephon/ops/__init__.py", exists=lambda name: name.endswith((".a", ".b")))}
    assert found == {"zephon.ops.a", "zephon.b", "zephon.ops.c"}
    found = {i.target for i in imports_of("from . import a\nfrom ..x.y import z\n", "zephon/ops/pack.py",
                                          exists=lambda name: False)}
    assert found == {"zephon.ops", "zephon.x.y"}
