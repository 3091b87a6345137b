"""Test setup: the Triton interpreter must be on before any kernel module is imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
