"""Which files a `--module` is, and whether any changed: polling of modification times.

No watcher library is needed for a handful of source files: `FileWatch.changed()` compares each
file's (mtime_ns, size) with the last look, twice a second from `runfold dev`'s loop. A module
given by dotted name is found the way the worker imports it (the current directory first on the
path): a package is every `.py` under its folder, a plain module its file. A module given as a
path is that file.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path


def module_files(spec: str) -> list[Path]:
    """The source files of one `--module` value (empty when it cannot be found: the worker
    then says why when it starts)."""
    if spec.endswith(".py") or os.sep in spec:
        return [Path(spec).resolve()]
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        found = importlib.util.find_spec(spec)
    except (ImportError, ValueError):  # a parent package that does not import
        return []
    if found is None or found.origin is None:
        return []
    origin = Path(found.origin).resolve()
    if found.submodule_search_locations:  # a package: everything under it
        return sorted(
            p.resolve() for root in found.submodule_search_locations for p in Path(root).rglob("*.py")
        )
    return [origin]


def definition_files(folder: Path) -> list[Path]:
    return (
        sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        if folder.is_dir()
        else []
    )


class FileWatch:
    """Modification stamps of a set of files, re-listed on every look (files come and go)."""

    def __init__(self, list_files: Iterable[str] | None = None, folder: Path | None = None) -> None:
        self._modules = list(list_files or ())
        self._folder = folder
        self._stamps = self._look()

    def files(self) -> list[Path]:
        files = [f for spec in self._modules for f in module_files(spec)]
        if self._folder is not None:
            files += definition_files(self._folder)
        return files

    def _look(self) -> dict[Path, tuple[int, int]]:
        stamps: dict[Path, tuple[int, int]] = {}
        for path in self.files():
            try:
                st = path.stat()
            except OSError:
                continue
            stamps[path] = (st.st_mtime_ns, st.st_size)
        return stamps

    def changed(self) -> list[Path]:
        """The files added, removed or modified since the last call."""
        now = self._look()
        before, self._stamps = self._stamps, now
        return sorted(p for p in before.keys() | now.keys() if before.get(p) != now.get(p))
