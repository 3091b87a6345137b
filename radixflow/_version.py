"""The package version, readable without importing the DSL or the engine."""

__version__ = "0.1.0"
