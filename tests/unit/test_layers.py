"""The layout's import rule (docs/architecture.md: Layout), checked on every import of the package, lazy ones too:
each folder imports only the folders below it, and the manager's alone reaches the compute and agent folders."""

from __future__ import annotations

import ast

from runs import REPO

# What each part of the package may import from flare2, besides itself and flare2.errors.
_ALLOWED = {
    "wire": set(),
    "core": {"wire"},
    "zoo": {"core", "wire"},
    "runtime": {"core", "wire"},
    "runtime.agents": {"runtime", "core", "wire"},
    "runtime.compute": {"runtime", "core", "wire"},
    "runtime.manager": {"runtime", "runtime.compute", "runtime.agents", "core", "wire"},
    "commands": {"runtime", "runtime.manager", "runtime.compute", "runtime.agents", "zoo", "core", "wire"},
    "cli": {"commands", "runtime", "wire"},
    "errors": set(),
}


def _part(module: str) -> str:
    """The part of the layout a module ``flare2.X.Y...`` belongs to."""
    names = module.split(".")[1:]
    if names[:1] == ["runtime"] and len(names) > 2:
        return f"runtime.{names[1]}"
    return names[0] if names else ""


def _module(imported: str) -> str:
    """The module or package ``imported`` names: itself, or the module a name of it comes from."""
    names = imported.split(".")
    while len(names) > 1:
        place = REPO.joinpath(*names)
        if place.with_suffix(".py").is_file() or place.is_dir():
            break
        names.pop()
    return ".".join(names)


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flare2"):
            found.add(node.module)
            # `from flare2.runtime import exit_codes` imports the module flare2.runtime.exit_codes.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("flare2"))
    return found


def test_every_module_imports_only_the_parts_below_its_own():
    package = REPO / "flare2"
    modules = [path for path in package.rglob("*.py") if path.name != "__init__.py" or path.parent != package]
    assert len(modules) > 50
    wrong = []
    for path in modules:
        own = _part("flare2." + ".".join(path.relative_to(package).with_suffix("").parts))
        for imported in map(_module, _imports(path)):
            target = _part(imported)
            if target in ("", own, "errors"):
                continue
            if target not in _ALLOWED[own]:
                wrong.append(f"{path.relative_to(REPO)} imports {imported} ({own} -> {target})")
    assert not wrong, "\n".join(wrong)
