"""The engine's hot modules compiled with mypyc: built per set of engine sources, loaded only by them.

Compiled, the engine spends about a quarter less CPU per input with byte-identical outputs
(docs/benchmarks.md, "Engine CPU per input"). A compiled module placed beside its source would
shadow every later edit of that source, so a build lives apart, under the environment's prefix,
in a directory named by the sha256 of every engine source and the interpreter's extension ABI.
`processors/engine/__init__.py` puts that directory first on the package's `__path__` only when
it holds a finished build of the sources the package has now: an edit, a checkout or a pull
changes the key, and the engine runs interpreted until `runfold engine build` builds the new one.

`RUNFOLD_ENGINE` chooses: `auto` (the default: compiled when built), `interpreted`, or
`compiled` (the processor refuses to start, exit 2, when there is no build of these sources;
importing the engine never fails on it, so `runfold engine build` can always run).

This module is imported by the engine package before any of its modules, so it uses the
standard library only.

Compiled code does not raise `RecursionError`: every recursive walk in the compiled modules is
bounded before it runs (`nesting.too_deep` caps values at `max_json_depth`, templates are capped
when a definition registers, and the codec decodes at most 1,024 levels).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# The hot modules (processors/engine/<name>.py) that fold every input. The others (definition
# loading, validation, conditions, the catalog) run once per definition and stay interpreted.
COMPILED = (
    "budgets",
    "commands",
    "decider",
    "effects",
    "emitter",
    "evolve",
    "ids",
    "nesting",
    "receipts",
    "reducers",
    "refs",
    "secrets",
    "start",
    "state",
    "steps",
    "stopping",
    "superstep",
)
GROUP = "processors.engine.compiled"  # its shared library: processors/engine/compiled__mypyc.<abi>.so
MODES = ("auto", "interpreted", "compiled")
MANIFEST = "manifest.json"  # written last: a directory without it is an unfinished build
_FORMAT = "2"  # bump when the build's layout or options change: old builds stop matching
_KEEP = 3  # builds kept linked per environment (switching branches back needs no rebuild)
_GRACE_S = 3600  # an unlinked build (or a killed build's scratch) is deleted this long after

ENGINE_DIR = Path(__file__).resolve().parent / "engine"
EXT_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
_FILES = (*COMPILED, GROUP.rsplit(".", 1)[1] + "__mypyc")  # every extension module of a build


class NativeEngineError(RuntimeError):
    """The compiled engine cannot be had as asked; the message says why and what to do."""


def mode() -> str:
    value = os.environ.get("RUNFOLD_ENGINE", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise NativeEngineError(f"RUNFOLD_ENGINE must be one of {', '.join(MODES)}, not {value!r}")
    return value


def engine_key(engine_dir: Path = ENGINE_DIR) -> str:
    """sha256 over every engine source (name and bytes), the compiled set, the build format and
    the extension ABI: any change to any of them names another build."""
    h = hashlib.sha256()
    for part in (_FORMAT, EXT_SUFFIX, " ".join(COMPILED)):
        h.update(part.encode() + b"\0")
    for path in sorted(engine_dir.glob("*.py")):
        data = path.read_bytes()
        h.update(path.name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def builds_root(prefix: str | None = None) -> Path:
    """Where this environment keeps its builds: inside it, owned by whoever owns it."""
    return Path(prefix if prefix is not None else sys.prefix) / "share" / "runfold" / "engine"


def build_dir(key: str, root: Path | None = None) -> Path:
    """The link naming the build of `key`. It points at a directory of its own per build, so a
    new build (or a forced one) swaps the link and never deletes what a process may be loading."""
    return (root if root is not None else builds_root()) / key[:32]


def finished(directory: Path, key: str) -> bool:
    """A finished build of exactly `key`: its manifest names the key, every module is there."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return False
    return all((directory / f"{name}{EXT_SUFFIX}").is_file() for name in _FILES)


def compiler_version() -> str | None:
    """The installed mypy's version (mypyc comes with it), or None without one."""
    try:
        return importlib.metadata.version("mypy")
    except importlib.metadata.PackageNotFoundError:
        return None


def built_by(directory: Path) -> str | None:
    """The mypy version a build's manifest names (None: unknown, or a build from before it was recorded)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    version = manifest.get("mypy") if isinstance(manifest, dict) else None
    return version if isinstance(version, str) else None


def _outdated(directory: Path) -> bool:
    """A build made by another mypy than the installed one. It still loads (a build is correct
    for its sources whichever mypyc made it, and the key says nothing of the compiler, so no
    process switches engine on a mypy upgrade), but `build()` makes it again, to carry the new
    compiler's fixes."""
    installed = compiler_version()
    return installed is not None and built_by(directory) != installed


def _build_of(key: str, root: Path | None) -> Path | None:
    """The directory of the finished build of `key`, resolved once (the link may move after)."""
    try:
        directory = build_dir(key, root).resolve(strict=True)
    except OSError:
        return None
    return directory if finished(directory, key) else None


def compiled_dir(engine_dir: Path = ENGINE_DIR, root: Path | None = None) -> str | None:
    """The directory the engine package puts first on its `__path__`, or None to run interpreted.
    Never raises: a process that must run compiled checks `choice_problem` (the processor does)."""
    try:
        chosen = mode()
    except NativeEngineError:
        return None
    if chosen == "interpreted":
        return None
    directory = _build_of(engine_key(engine_dir), root)
    return None if directory is None else str(directory)


def choice_problem(engine_dir: Path = ENGINE_DIR, root: Path | None = None) -> str | None:
    """Why `RUNFOLD_ENGINE` cannot be honoured (an unknown value, or `compiled` with no build of
    these sources), or None. The processor refuses to start on it (exit 2)."""
    try:
        chosen = mode()
    except NativeEngineError as e:
        return str(e)
    if chosen == "compiled":
        key = engine_key(engine_dir)
        if _build_of(key, root) is None:
            return (
                f"RUNFOLD_ENGINE=compiled, but there is no build of the engine sources in {engine_dir} "
                f"(key {key[:12]}): run `runfold engine build`"
            )
    return None


def running() -> str:
    """Which engine this process runs: `compiled`, `interpreted`, or `mixed` (some modules of
    each: a build deleted by hand while the process imported it). Imports the engine."""
    origins = {
        (importlib.import_module(f"processors.engine.{name}").__file__ or "").endswith(EXT_SUFFIX)
        for name in COMPILED
    }
    return "mixed" if len(origins) > 1 else ("compiled" if origins == {True} else "interpreted")


def missing_prerequisites() -> str | None:
    """What a build needs and this environment lacks (mypy's mypyc, setuptools, a C compiler,
    Python's headers), said before a build spends seconds finding out."""
    for module, extra in (("mypyc", "mypy"), ("setuptools", "setuptools")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed in this environment: pip install 'runfold[compiled]' ({extra})"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler: {compiler!r} is not on PATH (Debian: apt-get install gcc)"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers: {headers} is missing (Debian: apt-get install python3-dev)"
    return None


@dataclass(frozen=True)
class Build:
    key: str
    directory: Path
    built: bool  # False: a finished build of this key was already there
    seconds: float


def build(*, force: bool = False, root: Path | None = None, echo: bool = False) -> Build:
    """Build the compiled engine for the sources as they are now (nothing when built).

    The sources are copied first and the copy is what is hashed and compiled, so an edit during
    the build cannot give a build the wrong key. The build happens in a scratch directory and
    moves into a directory of its own with its manifest; then the key's link is swapped to it in
    one rename. A killed build leaves nothing that loads, a concurrent one of the same sources
    only a second directory, and the directory a link left is deleted an hour later, not while
    a process may be loading it. Raises NativeEngineError, with the compiler's output when it
    failed.
    """
    start = time.monotonic()
    root = root if root is not None else builds_root()
    key = engine_key()
    existing = _current_build(key, root)
    if existing is not None and not force:  # checked again on the copy below
        return Build(key, existing, False, time.monotonic() - start)
    missing = missing_prerequisites()
    if missing is not None:
        raise NativeEngineError(f"cannot build the compiled engine: {missing}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    except OSError as e:
        raise NativeEngineError(f"cannot write the builds directory {root}: {e}") from e
    try:
        src = scratch / "src"
        (src / "processors" / "engine").mkdir(parents=True)
        (src / "processors" / "__init__.py").write_text("")
        for path in ENGINE_DIR.glob("*.py"):
            shutil.copy2(path, src / "processors" / "engine" / path.name)
        key = engine_key(src / "processors" / "engine")
        link = build_dir(key, root)
        existing = _current_build(key, root)
        if existing is not None and not force:
            return Build(key, existing, False, time.monotonic() - start)
        _compile(src, scratch / "lib", scratch / "tmp", echo=echo)
        existing = _current_build(key, root)
        if existing is not None and not force:  # another build of the same sources finished first
            return Build(key, existing, False, time.monotonic() - start)
        out = scratch / "lib" / "processors" / "engine"
        manifest = {
            "key": key,
            "modules": list(COMPILED),
            "ext_suffix": EXT_SUFFIX,
            "mypy": compiler_version(),
            "built_at": time.time(),
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        target = root / f"{key[:32]}-{scratch.name.removeprefix('.build-')}"
        out.rename(target)
        previous = link.resolve() if link.is_symlink() else None
        swap = scratch / "link"
        swap.symlink_to(target.name)
        os.replace(swap, link)  # the one step that publishes the build
        if previous is not None and previous != target:
            _left(previous)
        _prune(root)
        return Build(key, target, True, time.monotonic() - start)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _current_build(key: str, root: Path | None) -> Path | None:
    """The finished build of `key` made by the installed mypy: what makes a build unnecessary."""
    directory = _build_of(key, root)
    return None if directory is None or _outdated(directory) else directory


def _compile(src: Path, lib: Path, tmp: Path, *, echo: bool) -> None:
    """mypyc through setuptools, in a child process (mypy's memory goes with it)."""
    setup = (
        "import sys\n"
        "from setuptools import setup\n"
        "from mypyc.build import mypycify\n"
        "paths = [f'processors/engine/{m}.py' for m in sys.argv[1].split(',')]\n"
        "setup(name='runfold-engine', ext_modules=mypycify(paths, group_name=sys.argv[2], opt_level='3'),\n"
        "      script_args=['-q', 'build_ext', '--build-lib', sys.argv[3], '--build-temp', sys.argv[4]])\n"
    )
    # no mypy config but the one written here: the user's own must not change the build
    (src / "mypy.ini").write_text("[mypy]\nignore_missing_imports = True\n")
    inherited = os.environ.get("PYTHONPATH")
    proc = subprocess.run(
        [sys.executable, "-c", setup, ",".join(COMPILED), GROUP, str(lib), str(tmp)],
        cwd=src,
        env={
            **os.environ,
            "MYPY_CACHE_DIR": str(tmp / "mypy-cache"),
            # the copy first (what is compiled), then whatever this process was given
            "PYTHONPATH": os.pathsep.join([str(src), *([inherited] if inherited else [])]),
        },
        stdout=None if echo else subprocess.PIPE,
        stderr=subprocess.STDOUT if not echo else None,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout or "").splitlines()[-30:])
        raise NativeEngineError(f"mypyc failed (exit {proc.returncode}):\n{tail}")


def _left(directory: Path) -> None:
    """A build no link names any more: its clock starts now (`_prune` deletes it after the grace)."""
    with contextlib.suppress(OSError):
        os.utime(directory)


def _prune(root: Path) -> None:
    """Keep the `_KEEP` most recently linked builds. Unlink the others, and delete what no link
    names (builds left, a killed build's scratch) once `_GRACE_S` has passed since it was left:
    a process that resolved a link just before it moved has long finished importing by then.
    Entries may vanish meanwhile (another build prunes too): each step tolerates it."""
    links: list[tuple[float, Path]] = []
    for entry in root.iterdir():
        with contextlib.suppress(OSError):
            if entry.is_symlink():
                links.append((entry.lstat().st_mtime, entry))
    links.sort(reverse=True)
    kept: set[str] = set()
    for index, (_, link) in enumerate(links):
        with contextlib.suppress(OSError):
            target = root / os.readlink(link)
            if index < _KEEP:
                kept.add(target.name)
            else:
                link.unlink()
                _left(target)
    now = time.time()
    for entry in root.iterdir():
        with contextlib.suppress(OSError):
            if entry.is_symlink() or entry.name in kept or not entry.is_dir():
                continue
            if now - entry.stat().st_mtime > _GRACE_S:
                shutil.rmtree(entry, ignore_errors=True)


def status(root: Path | None = None) -> dict[str, object]:
    """What `runfold engine status` reports (without importing the engine)."""
    key = engine_key()
    directory = _build_of(key, root)
    problem = choice_problem(root=root)
    try:
        chosen = mode()
    except NativeEngineError:
        chosen = os.environ.get("RUNFOLD_ENGINE", "")
    runs = "compiled" if chosen in ("auto", "compiled") and directory is not None else "interpreted"
    # a compiled module beside its source (mypyc run in place by hand) shadows every edit of it
    in_tree = sorted(p.name for p in ENGINE_DIR.glob(f"*{EXT_SUFFIX}"))
    return {
        "mode": chosen,
        "runs": "stale compiled modules in the source tree" if in_tree else runs,
        "problem": problem
        or (
            f"compiled modules in {ENGINE_DIR} shadow their sources: delete {', '.join(in_tree)}"
            if in_tree
            else None
        ),
        "sources": str(ENGINE_DIR),
        "key": key,
        "built": directory is not None,
        "directory": str(directory or build_dir(key, root)),
        "modules": list(COMPILED),
        # the build loads whichever mypy made it; `runfold engine build` remakes an outdated one
        "built_by_mypy": None if directory is None else built_by(directory),
        "installed_mypy": compiler_version(),
        "outdated": directory is not None and _outdated(directory),
    }
