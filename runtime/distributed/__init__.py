"""Tensor parallelism: the rank group, sharded layers and the worker ranks."""
