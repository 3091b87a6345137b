"""Triton kernels, each beside a torch reference of the same signature (`*_ref`)."""
