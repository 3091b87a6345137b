"""Kernels: Triton (imported only when chosen) and C++ for the CPU, each op with one torch
reference of the same signature in `reference.py` (`*_ref`)."""
