"""The error catalog cannot rot: codes are unique, every error class is catalogued with its doc,
docs/errors.md is exactly what the catalog generates, and every code has a test that provokes it
(a test named ``test_<CODE>_...`` that names the error)."""

import ast
import importlib
import pathlib
import pkgutil
import re

import pytest

import fexplore
from fexplore import error_catalog
from fexplore.errors import ErrorDoc, FexploreError

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "errors.md"
TEST_NAME = re.compile(r"test_(F[XK]\d{3})_")


@pytest.fixture(scope="module")
def entries():
    return error_catalog.catalog()


def test_codes_are_unique_and_well_formed(entries):
    codes = [e.code for e in entries]
    assert len(codes) == len(set(codes)), sorted(c for c in codes if codes.count(c) > 1)
    assert all(re.fullmatch(r"F[XK]\d{3}", c) for c in codes), codes
    # the families the issue names are all there
    for code in ("FX000", "FX100", "FX200", "FX300", "FX301", "FX400", "FX401", "FX402", "FX404",
                 "FX410", "FX411", "FX412", "FK100", "FK170"):
        assert code in codes


def test_every_entry_says_when_what_and_how_to_fix(entries):
    for e in entries:
        assert isinstance(e.doc, ErrorDoc)
        assert len(e.doc.when) > 40 and len(e.doc.fix) > 20 and e.doc.example.strip(), e.code
        assert e.summary, e.code
    # a subclass with its own code brings its own entry; it may not reuse its parent's
    docs = [id(e.doc) for e in entries]
    assert len(docs) == len(set(docs))


def _all_fexplore_modules():
    for info in pkgutil.walk_packages(fexplore.__path__, "fexplore."):
        importlib.import_module(info.name)


def test_every_error_class_anywhere_in_the_package_is_catalogued(entries):
    _all_fexplore_modules()
    catalogued = {e.cls for e in entries}
    for cls in error_catalog.error_classes():
        if cls in catalogued:
            assert cls.__module__ in error_catalog.ERROR_MODULES, cls
            continue
        # not catalogued: only a grouping base (no code of its own, subclasses that have one)
        assert "code" not in vars(cls), f"{cls.__qualname__} has a code but no catalog entry"
        assert cls.__subclasses__(), f"{cls.__module__}.{cls.__qualname__} is an error with no " \
                                     "code of its own: give it one and an ErrorDoc"


def test_docs_errors_md_is_generated_from_the_catalog(entries, tmp_path):
    text = error_catalog.markdown(entries)
    assert DOC.read_text(encoding="utf-8") == text, \
        "docs/errors.md is stale: run python -m fexplore.error_catalog --write docs/errors.md"
    for e in entries:
        assert f"### {e.code}" in text and e.doc.fix in text
    assert error_catalog.main(["--check", str(DOC)]) == 0
    stale = tmp_path / "errors.md"
    stale.write_text(text.replace(entries[0].doc.fix, "something else"), encoding="utf-8")
    assert error_catalog.main(["--check", str(stale)]) == 1
    error_catalog.main(["--write", str(stale)])
    assert stale.read_text(encoding="utf-8") == text


def _code_tests() -> dict[str, list[str]]:
    """Code -> the source of each test function named for it, over the whole test suite."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                m = TEST_NAME.match(node.name)
                if m:
                    out.setdefault(m.group(1), []).append(ast.get_source_segment(source, node))
    return out


def test_every_code_has_a_test_that_provokes_it(entries):
    tests = _code_tests()
    codes = {e.code for e in entries}
    missing = sorted(codes - set(tests))
    assert not missing, f"codes with no test_<CODE>_... test: {missing}"
    unknown = sorted(set(tests) - codes)
    assert not unknown, f"tests named for codes that do not exist: {unknown}"
    for e in entries:
        # the test checks for that error, by class or by code
        assert any(e.cls.__name__ in src or e.code in src for src in tests[e.code]), e.code
