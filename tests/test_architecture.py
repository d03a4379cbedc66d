"""DESIGN.md "Layout": one package, one layer, and packages import downwards only.
import-linter's contracts (.importlinter) say who may import whom; these tests run them,
count the imports between packages themselves (inside functions too) so that no two
packages import each other, keep the agent out of every server package but the demo, and
find imports of the project hidden inside functions, the way cycles used to be dodged."""

import ast
import configparser
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Imports inside a function that are there for another reason than a cycle.
DEFERRED_IMPORTS = {
    ("clusters/apps.py", ".oidc"),  # AppConfig.ready(): the models are loaded only then
    ("clusters/apps.py", ".roles"),
    ("schedulers/__init__.py", ".kubernetes"),  # the Kubernetes client is slow to import
}
NOT_CODE = ("tests", "migrations")


def server_packages():
    """The top-level packages of the server, as .importlinter lists them (the agent apart)."""
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    return [name for name in config["importlinter"]["root_packages"].split() if name != "agent"]


SERVER_PACKAGES = server_packages()


def code_files(package):
    for path in sorted((REPO / package).rglob("*.py")):
        relative = path.relative_to(REPO)
        if not any(part in NOT_CODE for part in relative.parts):
            yield relative


def imported_modules(path, tree=None):
    """Every module an import statement of the file names, anywhere in it, as
    (dotted name, line); relative imports resolved against the file's package."""
    tree = tree or ast.parse((REPO / path).read_text())
    package = list(path.with_suffix("").parts)
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                names = ([node.module] if node.module
                         else [alias.name for alias in node.names])  # from . import views
                found.extend((".".join(base + [name]), node.lineno) for name in names)
            else:
                found.append((node.module, node.lineno))
    return found


def imports_between_packages(packages):
    """{(importer, imported): how many import statements}, between top-level packages."""
    counts = Counter()
    for package in packages:
        for path in code_files(package):
            for name, _ in imported_modules(path):
                top = name.split(".")[0]
                if top != package and top in (*packages, "agent"):
                    counts[(package, top)] += 1
    return counts


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports), "--no-logo", "--no-cache"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_no_two_packages_import_each_other():
    counts = imports_between_packages(SERVER_PACKAGES)
    both_ways = sorted(f"{a} <-> {b} ({counts[(a, b)]} / {counts[(b, a)]} imports)"
                       for a, b in counts if a < b and (b, a) in counts)
    assert both_ways == [], "packages that import each other: " + "; ".join(both_ways)


def test_only_the_demo_imports_the_agent():
    counts = imports_between_packages(SERVER_PACKAGES)
    assert sorted(a for a, b in counts if b == "agent") == ["demo"]


def test_the_counter_counts_imports_inside_functions_and_relative_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    for package, source in {
        "low": "from . import own\n",
        "high": "import low.models\n\ndef f():\n    from low import x\n",
        "other": "def g():\n    from high.views import v\n    import agent.sim\n",
    }.items():
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "code.py").write_text(source)
    (tmp_path / "low" / "tests").mkdir()
    (tmp_path / "low" / "tests" / "test_x.py").write_text("import high\n")
    assert imports_between_packages(["low", "high", "other"]) == Counter(
        {("high", "low"): 2, ("other", "high"): 1, ("other", "agent"): 1})


def function_level_imports(path):
    """Imports of the project inside a function, as (spelled as written, line)."""
    tree = ast.parse((REPO / path).read_text())
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom):
                spelled = "." * node.level + (node.module or "")
            elif isinstance(node, ast.Import):
                spelled = node.names[0].name
            else:
                continue
            if spelled.startswith(".") or spelled.split(".")[0] in (*SERVER_PACKAGES, "agent"):
                found.append((spelled, node.lineno))
    return found


def test_no_import_of_the_project_hides_inside_a_function():
    hidden = [f"{path}:{line} imports {spelled}"
              for package in SERVER_PACKAGES for path in code_files(package)
              for spelled, line in function_level_imports(path)
              if (str(path), spelled) not in DEFERRED_IMPORTS]
    assert hidden == [], "a cycle is a design question: " + "; ".join(hidden)


def test_the_hidden_import_finder_finds_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "example.py").write_text(
        "import os\n\ndef f():\n    from nodes.models import Node\n    import json\n")
    assert function_level_imports(Path("example.py")) == [("nodes.models", 4)]


# The modules of an app that serve its pages (STYLE.md, an app's shape): a module of the
# domain (models, services, rules, steps...) never imports one, of its own app or another.
PAGE_MODULES = {"views", "urls", "forms", "filters", "queries", "responses", "tasks",
                "templatetags", "management", "accounts"}


def is_page(module):
    return any(part in PAGE_MODULES for part in module.split(".")[1:])


def test_no_domain_module_imports_a_page_module():
    domain_packages = [p for p in SERVER_PACKAGES
                       if p not in ("clusterui", "overview", "gateway", "api", "demo")]
    wrong = []
    for package in domain_packages:
        for path in code_files(package):
            module = ".".join(path.with_suffix("").parts).removesuffix(".__init__")
            if is_page(module):
                continue
            wrong += [f"{path}:{line} imports {name}" for name, line in imported_modules(path)
                      if name.split(".")[0] in SERVER_PACKAGES and is_page(name)]
    assert wrong == [], "a domain module imports a page module: " + "; ".join(wrong)


def test_the_page_rule_finds_a_service_importing_its_views(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "services.py").write_text("from . import views\n")
    (tmp_path / "nodes" / "views.py").write_text("from .services import x\n")
    found = [name for name, _ in imported_modules(Path("nodes/services.py"))]
    assert found == ["nodes.views"] and is_page(found[0]) and not is_page("nodes.services")
