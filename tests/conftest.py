"""Test setup: the Triton interpreter must be on before any kernel module is imported."""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")
# Helper modules the tests import: their asserts report values like the tests' own.
pytest.register_assert_rewrite("server_harness", "kv_checks")
