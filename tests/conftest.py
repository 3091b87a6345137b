"""Test setup: the Triton interpreter must be on before any kernel module is imported."""

import os

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("TRITON_INTERPRET", "1")
# Fuzz tests: the same examples on every run (CI must not flake), no time limit per example (the
# tests bound time themselves), and a failing example's blob printed for replay.
settings.register_profile(
    "radixflow",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("radixflow")
# Helper modules the tests import: their asserts report values like the tests' own.
pytest.register_assert_rewrite("server_harness", "kv_checks")
