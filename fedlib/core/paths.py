"""The repository's folders: the one place in fedlib that knows where things live on disk.

``FEDLIB_DATA`` and ``FEDLIB_CACHE`` (environment) move the raw datasets and the feature cache.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
PROFILE_FILE = NOTEBOOK_DIR / "profiles.yml"
EXECUTED_DIR = REPO / "book" / "executed"
BENCHMARK_DIR = REPO / "book" / "benchmarks"
RECORD_DIR = REPO / "book" / "records"        # recorded runs: long comparisons run once, committed
FAILED_DIR = Path(tempfile.gettempdir()) / "fedlib-failed"   # failed runs, never read by the book


def data_root() -> Path:
    """``$FEDLIB_DATA`` if set, else ``<repo>/data/raw``: where raw datasets are looked for."""
    env = os.environ.get("FEDLIB_DATA")
    return Path(env).expanduser() if env else REPO / "data" / "raw"


def cache_dir() -> Path:
    """``$FEDLIB_CACHE`` if set, else ``<repo>/data/cache``: the backbone-feature cache."""
    return Path(os.environ.get("FEDLIB_CACHE", REPO / "data" / "cache"))
