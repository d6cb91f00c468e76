"""What the figures were measured on: machine, Python, package versions."""

from __future__ import annotations

import os
import platform
import sys

__all__ = ["describe", "load_average", "packages", "atlas_fast_info"]

_PACKAGES = (
    "atlas-fast",
    "torch-atlas-ds",
    "numpy",
    "zstandard",
    "torch",
    "mosaicml-streaming",
    "litdata",
    "datasets",
    "pyarrow",
    "zarr",
    "matplotlib",
)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def describe() -> dict:
    affinity = None
    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "memory_bytes": _memory_bytes(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
    }


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def packages(readers: dict) -> dict:
    from importlib import metadata

    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def atlas_fast_info() -> dict:
    import atlas_fast
    from atlas_fast import _backend

    try:
        zstd = atlas_fast.zstd_library()
    except Exception as exc:  # the report must not fail over a diagnostic
        zstd = {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "version": atlas_fast.__version__,
        "default_backend": atlas_fast.BACKEND,
        "extension_error": _backend.extension_error,
        "zstd_library": zstd,
        "block_shuffle_sampler": hasattr(atlas_fast, "BlockShuffleSampler"),
        "getitems": hasattr(atlas_fast.AtlasDataset, "__getitems__"),
    }
