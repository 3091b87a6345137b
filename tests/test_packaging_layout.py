"""pyproject.toml matches the tree: every package folder is listed (a folder left out is missing
from wheels while an editable install still finds it), its data files ship, and the declared
dependencies are the third-party packages the code imports."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]

# Declared but used without an import statement: ninja runs torch.utils.cpp_extension's builds,
# swagger-ui-py's files are found with importlib.util.find_spec.
USED_WITHOUT_IMPORT = {"ninja", "swagger-ui-py"}
# Imported but pinned by a declared dependency (pydantic pins its own core).
PINNED_BY_A_DEPENDENCY = {"pydantic-core"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def package_folder(package: str) -> Path:
    """The folder a package name maps to through [tool.setuptools] package-dir."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        mapped = SETUPTOOLS["package-dir"].get(".".join(parts[:n]))
        if mapped is not None:
            return ROOT / mapped / Path(*parts[n:])
    raise AssertionError(f"{package} is under no package-dir entry")


def test_every_package_folder_is_listed_and_exists():
    listed = set(SETUPTOOLS["packages"])
    found = set()
    for root_package, folder in SETUPTOOLS["package-dir"].items():
        for sub in (ROOT / folder).rglob("*"):
            if sub.is_dir() and "__pycache__" not in sub.parts and any(sub.glob("*.py")):
                rel = sub.relative_to(ROOT / folder).parts
                found.add(".".join((root_package, *rel)))
        found.add(root_package)
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    missing = {p for p in listed if not package_folder(p).is_dir()}
    assert missing == set(), "listed packages without a folder"


def test_data_files_are_covered_by_package_data():
    data = SETUPTOOLS["package-data"]
    for package in SETUPTOOLS["packages"]:
        folder = package_folder(package)
        for path in folder.iterdir():
            if path.is_file() and path.suffix != ".py":
                patterns = data.get(package, [])
                assert any(path.match(p) for p in patterns), f"{path} is not in package-data"
    assert sorted(package_folder("radixflow.kernels.cpu").glob("*.cpp")), "no C++ sources"
    assert sorted(package_folder("radixflow.grammars").glob("*.lark")), "no bundled grammars"


def imported_top_level_modules() -> set[str]:
    names = set()
    for folder in {*SETUPTOOLS["package-dir"].values()}:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "radixflow"}


def requirement_name(requirement: str) -> str:
    return normalize(re.match(r"[A-Za-z0-9_.-]+", requirement).group())


def test_dependencies_are_what_the_code_imports():
    project = PYPROJECT["project"]
    declared = {requirement_name(r) for r in project["dependencies"]}
    extras = {requirement_name(r) for r in project["optional-dependencies"]["openai"]}
    dists = packages_distributions()
    imported = {normalize(d) for m in imported_top_level_modules() for d in dists.get(m, [m])}
    assert imported - declared - extras - PINNED_BY_A_DEPENDENCY == set(), "undeclared imports"
    assert declared - imported - USED_WITHOUT_IMPORT == set(), "declared, never imported"
    assert "triton" in declared and "openai" not in declared
