"""The single source of the package version (pyproject.toml reads it as the dynamic version)."""

__version__ = "0.1.0"
