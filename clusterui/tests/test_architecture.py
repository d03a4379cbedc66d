"""DESIGN.md "Layout": apps import downwards only. import-linter's contracts (.importlinter)
say who may import whom; these tests run them, keep them exhaustive (every module is either
domain or a page/adapter, so a new module cannot slip between the two), and find imports
hidden inside functions, the way cycles used to be dodged."""

import ast
import configparser
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER_PACKAGES = ("common", "clusterui", "nodes", "healthchecks", "repairs", "jobs",
                   "startup", "schedulers")
# Imports inside a function that are there for another reason than a cycle.
DEFERRED_IMPORTS = {
    ("clusterui/apps.py", ".roles"),  # AppConfig.ready(): the models are loaded only then
    ("schedulers/__init__.py", ".kubernetes"),  # the Kubernetes client is slow to import
}


def contracts():
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    return config


def listed(config, contract, option):
    return config[f"importlinter:contract:{contract}"][option].split()


def matches(pattern, module):
    """import-linter's module expressions: * is one name, ** one or more."""
    regex = re.escape(pattern).replace(r"\*\*", "[^.]+(\\.[^.]+)*").replace(r"\*", "[^.]+")
    return re.fullmatch(regex, module) is not None


def server_modules():
    for package in SERVER_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO)
            if "tests" in relative.parts or "migrations" in relative.parts:
                continue
            yield ".".join(relative.with_suffix("").parts).removesuffix(".__init__"), relative


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports), "--no-logo", "--no-cache"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def covered(module, expressions):
    """Whether the module, or a package it is in, is one of the expressions."""
    parts = module.split(".")
    prefixes = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
    return any(matches(expression, prefix) for expression in expressions for prefix in prefixes)


def test_every_module_is_either_domain_or_a_page_or_adapter():
    """A module the contract does not list as domain must be one it forbids the domain to
    import; otherwise nothing checks it."""
    config = contracts()
    domain = listed(config, "domain-imports-no-page", "source_modules")
    above = listed(config, "domain-imports-no-page", "forbidden_modules")
    unplaced = [module for module, path in server_modules()
                if module not in SERVER_PACKAGES  # a package's own __init__: wiring at most
                and not module.startswith("common")  # the leaf: a contract of its own
                and not covered(module, domain) and not covered(module, above)]
    assert unplaced == [], f"place these in .importlinter (domain, or a page/adapter): {unplaced}"


def test_the_pattern_matching_reads_import_linter_expressions():
    assert matches("*.views", "nodes.views") and not matches("*.views", "nodes.views.x")
    assert matches("*.management.**", "jobs.management.commands.import_jobs")
    assert not matches("nodes.ingest", "nodes.ingestion")
    assert covered("repairs.views", ["*.views"]) and covered("jobs.management.commands.x",
                                                             ["*.management"])
    assert not covered("nodes.services", ["*.views", "nodes.ingest"])


def function_level_imports(path):
    tree = ast.parse(path.read_text())
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom):
                name = "." * node.level + (node.module or "")
            elif isinstance(node, ast.Import):
                name = node.names[0].name
            else:
                continue
            if name.startswith(".") or name.split(".")[0] in (*SERVER_PACKAGES, "agent"):
                found.append((name, node.lineno))
    return found


def test_no_import_of_the_project_hides_inside_a_function():
    hidden = []
    for _, path in server_modules():
        for name, line in function_level_imports(REPO / path):
            if (str(path), name) not in DEFERRED_IMPORTS:
                hidden.append(f"{path}:{line} imports {name}")
    assert hidden == [], "a cycle is a design question: " + "; ".join(hidden)


def test_the_hidden_import_finder_finds_one(tmp_path):
    source = tmp_path / "example.py"
    source.write_text("import os\n\ndef f():\n    from nodes.models import Node\n    import json\n")
    assert function_level_imports(source) == [("nodes.models", 4)]
