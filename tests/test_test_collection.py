"""Every test file of the repository is collected by `make test` (STYLE.md, Tests): it lies
under one of pytest.ini's testpaths and its name matches python_files, and every Django app
of the repository with a tests/ package is in testpaths, so a new app's tests are not
forgotten (jobs/tests once sat outside testpaths and never ran)."""

import configparser
import fnmatch
import subprocess
from pathlib import Path, PurePosixPath

from django.apps import apps

REPO = Path(__file__).resolve().parents[1]
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py")
# Not test folders: bench/ holds benchmarks that print figures; the rest is installed code.
NOT_TESTS = ("bench", "node_modules", ".venv")


def pytest_ini():
    ini = configparser.ConfigParser(interpolation=None)
    assert ini.read(REPO / "pytest.ini"), f"no pytest.ini in {REPO}"
    return ini["pytest"]


def ini_testpaths():
    return [PurePosixPath(p) for p in pytest_ini()["testpaths"].split()]


def python_files():
    return pytest_ini().get("python_files", "test_*.py *_test.py").split()


def repository_test_files():
    """The repository's test files, tracked or new (untracked but not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    return sorted({
        PurePosixPath(name) for name in listed
        if name
        and any(fnmatch.fnmatch(PurePosixPath(name).name, p) for p in TEST_FILE_PATTERNS)
        and not any(part in NOT_TESTS for part in PurePosixPath(name).parts)
        and (REPO / name).is_file()
    })


def under(path, folders):
    return any(path.parts[:len(f.parts)] == f.parts or f == PurePosixPath(".")
               for f in folders)


def uncollected(files, folders, patterns):
    """The files pytest would not collect: outside every folder, or a name no pattern takes."""
    return [str(f) for f in files
            if not under(f, folders) or not any(fnmatch.fnmatch(f.name, p) for p in patterns)]


def test_every_test_file_is_collected():
    files = repository_test_files()
    assert PurePosixPath("tests/test_test_collection.py") in files  # the listing works
    left_out = uncollected(files, ini_testpaths(), python_files())
    assert not left_out, (
        f"pytest.ini (testpaths = {' '.join(map(str, ini_testpaths()))}, python_files = "
        f"{' '.join(python_files())}) does not collect these test files: {left_out}")


def test_every_app_with_tests_is_in_testpaths():
    folders = ini_testpaths()
    apps_with_tests = []
    for config in apps.get_app_configs():
        path = Path(config.path).resolve()
        if not path.is_relative_to(REPO) or ".venv" in path.relative_to(REPO).parts:
            continue  # Django's and third-party apps
        if (path / "tests" / "__init__.py").is_file():
            apps_with_tests.append(PurePosixPath(path.relative_to(REPO).as_posix()))
    assert PurePosixPath("clusters") in apps_with_tests  # the app listing works
    missing = [str(a) for a in apps_with_tests if not under(a / "tests", folders)]
    assert not missing, f"apps whose tests/ is not in pytest.ini's testpaths: {missing}"


def test_the_check_finds_what_pytest_would_leave_out():
    files = [PurePosixPath(p) for p in (
        "nodes/tests/test_models.py", "jobs/tests/test_import.py", "nodes/tests/states_test.py")]
    folders = [PurePosixPath("nodes"), PurePosixPath("tests")]
    assert uncollected(files, folders, ["test_*.py"]) == [
        "jobs/tests/test_import.py", "nodes/tests/states_test.py"]
    assert uncollected(files, [PurePosixPath("nodes"), PurePosixPath("jobs")],
                       ["test_*.py", "*_test.py"]) == []
    assert not under(PurePosixPath("nodesx/tests/test_a.py"), folders)
