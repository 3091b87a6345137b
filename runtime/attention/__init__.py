"""Paged attention backends (SDPA/C++ on the CPU, Triton) and the plain reference they match."""
