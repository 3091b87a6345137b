"""Grammar C sources (`native_build`): each built once per machine into the cache, then loaded
as it is."""

import subprocess

import pytest

from radixflow.grammars import (
    json_schema_resolve,
    native_build,
    native_rows,
    native_walk,
    regex_terms,
)

NATIVES = [
    pytest.param(native_walk.trie_walk, native_walk.describe, "trie_walk-", "native trie walk"),
    pytest.param(native_rows.dfa_rows, native_rows.describe, "dfa_rows-", "native rows"),
    pytest.param(json_schema_resolve.schema_doc, None, "schema_doc-", None),
    pytest.param(regex_terms.regex_derivs, None, "regex_derivs-", None),
]


@pytest.mark.parametrize(("load", "describe", "prefix", "described"), NATIVES)
def test_builds_once_into_the_cache(monkeypatch, tmp_path, load, describe, prefix, described):
    if native_build.compiler() is None:
        pytest.skip("no C compiler on this machine: the fallback tests cover it")
    native_rows.dfa_rows()  # decided first, as this machine allows, before the cache moves
    monkeypatch.setenv("RADIXFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(native_build.NATIVE_ENV, raising=False)
    load.cache_clear()
    try:
        assert load() is not None
        assert describe is None or describe() == described
        built = sorted(p.name for p in (tmp_path / "grammar_native").iterdir())
        assert len(built) == 1 and built[0].startswith(prefix) and built[0].endswith(".so")

        def no_compile(*args, **kwargs):
            raise AssertionError("compiled again")

        monkeypatch.setattr(subprocess, "run", no_compile)
        load.cache_clear()
        assert load() is not None  # the built file is loaded as it is
    finally:
        load.cache_clear()
