"""The engine's hot modules compiled with mypyc: built per set of engine sources, loaded only by them.

Compiled, the engine spends about a quarter less CPU per input with byte-identical outputs
(docs/benchmarks.md, "Engine CPU per input"). A compiled module placed beside its source would
shadow every later edit of that source, so a build lives apart, under the environment's prefix,
in a directory named by the sha256 of every engine source and the interpreter's extension ABI.
`processors/engine/__init__.py` puts that directory first on the package's `__path__` only when
it holds a finished build of the sources the package has now: an edit, a checkout or a pull
changes the key, and the engine runs interpreted until `runfold engine build` builds the new one.

`RUNFOLD_ENGINE` chooses: `auto` (the default: compiled when built), `interpreted`, or
`compiled` (importing the engine fails when there is no build of these sources).

This module is imported by the engine package before any of its modules, so it uses the
standard library only.

Compiled code does not raise `RecursionError`: every recursive walk in the compiled modules is
bounded before it runs (`nesting.too_deep` caps values at `max_json_depth`, templates are capped
when a definition registers, and the codec decodes at most 1,024 levels).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
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
_FORMAT = "1"  # bump when the build's layout or options change: old builds stop matching
_KEEP = 3  # finished builds kept per environment (switching branches back needs no rebuild)

ENGINE_DIR = Path(__file__).resolve().parent / "engine"
EXT_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


class NativeEngineError(RuntimeError):
    """The compiled engine was asked for and cannot be had; the message says why and what to do."""


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
    return (root if root is not None else builds_root()) / key[:32]


def finished(directory: Path, key: str) -> bool:
    """A finished build of exactly `key`: its manifest names the key and every module is there."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return False
    return all((directory / f"{name}{EXT_SUFFIX}").is_file() for name in COMPILED)


def compiled_dir(engine_dir: Path = ENGINE_DIR, root: Path | None = None) -> str | None:
    """The directory the engine package puts first on its `__path__`, or None to run interpreted."""
    chosen = mode()
    if chosen == "interpreted":
        return None
    key = engine_key(engine_dir)
    directory = build_dir(key, root)
    if finished(directory, key):
        return str(directory)
    if chosen == "compiled":
        raise NativeEngineError(
            f"RUNFOLD_ENGINE=compiled, but there is no build of these engine sources (key {key[:12]}) "
            f"under {directory.parent}: run `runfold engine build`"
        )
    return None


def running() -> str:
    """Which engine this process runs: `compiled` or `interpreted` (imports the engine)."""
    module = importlib.import_module("processors.engine.evolve")
    return "compiled" if (module.__file__ or "").endswith(EXT_SUFFIX) else "interpreted"


@dataclass(frozen=True)
class Build:
    key: str
    directory: Path
    built: bool  # False: a finished build of this key was already there
    seconds: float


def build(*, force: bool = False, root: Path | None = None, echo: bool = False) -> Build:
    """Build the compiled engine for the sources as they are now (no-op when built).

    The sources are copied first and the copy is what is hashed and compiled, so an edit during
    the build cannot give a build the wrong key. The build happens in a scratch directory beside
    the target and is renamed into place with its manifest: a killed build leaves nothing that
    loads. Raises NativeEngineError with the compiler's output when mypyc or the C compiler fails.
    """
    start = time.monotonic()
    root = root if root is not None else builds_root()
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        src = scratch / "src"
        (src / "processors" / "engine").mkdir(parents=True)
        (src / "processors" / "__init__.py").write_text("")
        for path in ENGINE_DIR.glob("*.py"):
            shutil.copy2(path, src / "processors" / "engine" / path.name)
        key = engine_key(src / "processors" / "engine")
        target = build_dir(key, root)
        if finished(target, key) and not force:
            return Build(key, target, False, time.monotonic() - start)
        _compile(src, scratch / "lib", scratch / "tmp", echo=echo)
        out = scratch / "lib" / "processors" / "engine"
        manifest = {"key": key, "modules": list(COMPILED), "ext_suffix": EXT_SUFFIX, "built_at": time.time()}
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if finished(target, key) and not force:  # another build of the same sources won the race
            return Build(key, target, False, time.monotonic() - start)
        if target.exists():  # forced: set aside (an import this instant runs the same sources interpreted)
            target.rename(scratch / "replaced")
        out.rename(target)
        _prune(root, keep=target)
        return Build(key, target, True, time.monotonic() - start)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
    try:
        import mypyc  # noqa: F401  (only to say plainly when it is missing)
    except ImportError as e:
        raise NativeEngineError(
            "mypyc is not installed in this environment: pip install 'runfold[compiled]'"
        ) from e
    # no mypy config but the one written here: the user's own must not change the build
    (src / "mypy.ini").write_text("[mypy]\nignore_missing_imports = True\n")
    proc = subprocess.run(
        [sys.executable, "-c", setup, ",".join(COMPILED), GROUP, str(lib), str(tmp)],
        cwd=src,
        env={**os.environ, "MYPY_CACHE_DIR": str(tmp / "mypy-cache"), "PYTHONPATH": str(src)},
        stdout=None if echo else subprocess.PIPE,
        stderr=subprocess.STDOUT if not echo else None,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout or "").splitlines()[-30:])
        raise NativeEngineError(f"mypyc failed (exit {proc.returncode}):\n{tail}")


def _prune(root: Path, keep: Path) -> None:
    """Keep the newest `_KEEP` finished builds, and drop the scratch of builds killed over an
    hour ago (a build takes about 20 s; a younger scratch may be another build's, running)."""
    entries = [d for d in root.iterdir() if d.is_dir() and d != keep]
    scratch = [d for d in entries if d.name.startswith(".build-")]
    builds = sorted((d for d in entries if d not in scratch), key=lambda d: d.stat().st_mtime, reverse=True)
    for stale in builds[_KEEP - 1 :] + [d for d in scratch if time.time() - d.stat().st_mtime > 3600]:
        shutil.rmtree(stale, ignore_errors=True)


def status(root: Path | None = None) -> dict[str, object]:
    """What `runfold engine status` reports (without importing the engine)."""
    key = engine_key()
    directory = build_dir(key, root)
    return {
        "mode": mode(),
        "key": key,
        "built": finished(directory, key),
        "directory": str(directory),
        "modules": list(COMPILED),
    }
