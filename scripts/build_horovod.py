"""Build (once) and cache a Horovod wheel for the torch of the running Python.

Horovod's last release, 0.28.1, ships only as a source distribution, and that
sdist does not build against torch >= 2.1: its CMake files ask for C++14 while
torch's headers need C++17. This script downloads the sdist from the package
registry, raises the C++ standard to 17 (Horovod, its torch extension and the
bundled Gloo), builds a CPU wheel with PyTorch + Gloo (no TensorFlow, MXNet or
MPI), and keeps it in a cache keyed by Horovod version, torch version and
Python/platform tag, so that the roughly 3-minute build happens once per machine.

Run it with the Python of the environment the wheel is for (torch must be installed):

    python scripts/build_horovod.py             # prints the wheel's path (builds it if needed)
    python scripts/build_horovod.py --install   # ... and pip-installs it into this Python
    python -m pip install "$(python scripts/build_horovod.py)"

The cache is ``$SGD_WHEEL_CACHE`` (default ``~/.cache/sgd/wheels``). Progress goes to
stderr; the only line on stdout is the wheel's path. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

HOROVOD_VERSION = "0.28.1"

#: Build settings: PyTorch and Gloo only, CPU collectives through Gloo.
BUILD_ENV = {
    "HOROVOD_WITH_PYTORCH": "1",
    "HOROVOD_WITHOUT_TENSORFLOW": "1",
    "HOROVOD_WITHOUT_MXNET": "1",
    "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITH_GLOO": "1",
    "HOROVOD_CPU_OPERATIONS": "GLOO",
}

#: Edits to the sdist: (file, text that must be there, replacement). Every one must
#: apply, so a different sdist fails loudly instead of building something else.
PATCHES: List[Tuple[str, str, str]] = [
    # Horovod's own sources (they include torch's headers through the extension).
    ("CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    # The torch extension resets the standard for torch >= 1.5.
    ("horovod/torch/CMakeLists.txt", "set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 17)"),
    # Gloo forces -std=c++11 into its flags; build it as C++17 like everything it links with.
    ("third_party/gloo/CMakeLists.txt", "${CMAKE_CXX_FLAGS} -std=c++11 -fPIC", "${CMAKE_CXX_FLAGS} -std=c++17 -fPIC"),
]

#: Horovod's own runtime requirements; its setup.py also lists them as setup_requires,
#: which setuptools would try to fetch by itself during a --no-build-isolation build.
RUNTIME_REQUIREMENTS = {"cloudpickle": "cloudpickle", "psutil": "psutil", "yaml": "pyyaml",
                        "packaging": "packaging", "cffi": "cffi>=1.4.0"}
BUILD_REQUIREMENTS = {"setuptools": "setuptools", "wheel": "wheel"}

MIN_CMAKE = (3, 13)
MAX_CMAKE = (4, 0)  # exclusive: CMake 4 dropped compatibility with Horovod's old CMake files


def log(message: str) -> None:
    print(f"[build_horovod] {message}", file=sys.stderr, flush=True)


class BuildError(RuntimeError):
    """The wheel could not be built; the message says why and what to do."""


# --- what the wheel is for ---------------------------------------------------------------


def torch_version() -> str:
    """The torch version of this Python, read from its metadata (no import of torch needed)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        raise BuildError(
            f"torch is not installed in {sys.executable}; Horovod's torch extension is built against "
            "the installed torch. Install torch first (pip install torch -c constraints.txt), then run "
            "this script again with the same Python."
        ) from None


def python_tag() -> str:
    """``cp311-linux_x86_64``: what else the wheel's binary depends on."""
    impl = sys.implementation.cache_tag or f"py{sys.version_info[0]}{sys.version_info[1]}"
    impl = impl.replace("cpython-", "cp")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{platform}"


def cache_dir(override: Optional[str] = None) -> Path:
    return Path(override or os.environ.get("SGD_WHEEL_CACHE") or "~/.cache/sgd/wheels").expanduser()


def slot_for(cache: Path, horovod: str, torch: str) -> Path:
    """The folder that holds the wheel for one (horovod, torch, python/platform) combination.

    The wheel keeps its own file name inside it (pip needs a valid wheel name).
    """
    safe_torch = re.sub(r"[^A-Za-z0-9._-]", "_", torch)
    return cache / f"horovod-{horovod}" / f"torch-{safe_torch}" / python_tag()


def cached_wheel(slot: Path) -> Optional[Path]:
    wheels = sorted(slot.glob("horovod-*.whl")) if slot.is_dir() else []
    return wheels[-1] if wheels else None


# --- tools ---------------------------------------------------------------------------------


def run(cmd: List[str], cwd: Optional[Path] = None, env: Optional[Dict[str, str]] = None) -> None:
    log("$ " + " ".join(cmd))
    result = subprocess.run(cmd, cwd=cwd, env=env, stdout=sys.stderr, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise BuildError(f"command failed with exit code {result.returncode}: {' '.join(cmd)}")


def pip(*args: str) -> List[str]:
    return [sys.executable, "-m", "pip", *args]


def cmake_version(cmake: str) -> Optional[Tuple[int, ...]]:
    try:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    match = re.search(r"version\s+(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_cmake(constraints: List[str]) -> str:
    """A CMake in [3.13, 4): this environment's own, the one on PATH, or ``cmake<4`` installed here."""
    env_bin = Path(sysconfig.get_path("scripts"))
    candidates = [str(env_bin / "cmake"), shutil.which("cmake")]
    for cmake in candidates:
        if cmake and (version := cmake_version(cmake)) is not None:
            if MIN_CMAKE <= version < MAX_CMAKE:
                log(f"using CMake {version[0]}.{version[1]} at {cmake}")
                return cmake
            log(f"CMake {version[0]}.{version[1]} at {cmake} is not in [3.13, 4); not using it")
    log("installing CMake < 4 into this environment")
    run(pip("install", *constraints, "cmake>=3.13,<4"))
    cmake = str(env_bin / "cmake")
    if cmake_version(cmake) is None:
        raise BuildError(f"pip installed cmake<4 but {cmake} does not run; install CMake 3.x and set HOROVOD_CMAKE")
    return cmake


def ensure_requirements(constraints: List[str]) -> None:
    missing = [req for mod, req in {**BUILD_REQUIREMENTS, **RUNTIME_REQUIREMENTS}.items()
               if importlib.util.find_spec(mod) is None]
    if missing:
        log(f"installing build requirements: {', '.join(missing)}")
        run(pip("install", *constraints, *missing))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``, so two processes never build the same wheel at once."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another build holds {path}; waiting for it")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- the build -----------------------------------------------------------------------------


def download_sdist(version: str, dest: Path, constraints: List[str]) -> Path:
    run(pip("download", "--no-deps", "--no-binary", ":all:", f"horovod=={version}", "-d", str(dest), *constraints))
    found = sorted(dest.glob(f"horovod-{version}.tar.gz"))
    if not found:
        raise BuildError(f"pip download did not leave horovod-{version}.tar.gz in {dest}")
    return found[0]


def unpack(sdist: Path, dest: Path) -> Path:
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.11.4: check the members ourselves
            root = dest.resolve()
            for member in tar.getmembers():
                if not (root / member.name).resolve().is_relative_to(root):
                    raise BuildError(f"unsafe path {member.name!r} in {sdist}")
            tar.extractall(dest)
    roots = [p for p in dest.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise BuildError(f"expected one top-level folder in {sdist}, found {[p.name for p in roots]}")
    return roots[0]


def patch(source: Path) -> None:
    for rel, old, new in PATCHES:
        path = source / rel
        text = path.read_text()
        if old not in text:
            raise BuildError(
                f"cannot patch {rel}: {old!r} is not in it. This script knows Horovod {HOROVOD_VERSION}'s "
                "sdist; for another version, update PATCHES in scripts/build_horovod.py."
            )
        path.write_text(text.replace(old, new))
        log(f"patched {rel}: {old} -> {new}")


def build_wheel(source: Path, out: Path, cmake: str) -> Path:
    env = dict(os.environ)
    env.update(BUILD_ENV)
    env["HOROVOD_CMAKE"] = cmake
    # Horovod's setup.py runs make -j8 unless MAKEFLAGS is set: more jobs than cores only
    # costs memory (each translation unit includes torch's headers).
    env.setdefault("MAKEFLAGS", f"-j{os.cpu_count() or 2}")
    # Make the environment's own tools (cmake from pip, ...) visible to the build.
    env["PATH"] = os.pathsep.join([sysconfig.get_path("scripts"), env.get("PATH", "")])
    run(pip("wheel", "--no-build-isolation", "--no-deps", "--wheel-dir", str(out), str(source)), env=env)
    wheels = sorted(out.glob("horovod-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"pip wheel left {[w.name for w in wheels]} in {out}; expected one horovod wheel")
    return wheels[0]


def store(wheel: Path, slot: Path) -> Path:
    """Put ``wheel`` into ``slot`` atomically: copy under a temporary name there, then rename."""
    slot.mkdir(parents=True, exist_ok=True)
    final = slot / wheel.name
    fd, tmp = tempfile.mkstemp(dir=slot, prefix=".partial-", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(wheel, tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the wheel from other users
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return final


def get_wheel(version: str, cache: Path, force: bool, constraints: List[str]) -> Path:
    torch = torch_version()
    slot = slot_for(cache, version, torch)
    if not force and (wheel := cached_wheel(slot)) is not None:
        log(f"cached wheel for horovod {version}, torch {torch}, {python_tag()}")
        return wheel
    with locked(slot.parent / f".{slot.name}.lock"):
        if not force and (wheel := cached_wheel(slot)) is not None:  # built while we waited
            return wheel
        log(f"building horovod {version} for torch {torch}, {python_tag()} (a few minutes)")
        start = time.monotonic()
        ensure_requirements(constraints)
        cmake = find_cmake(constraints)
        with tempfile.TemporaryDirectory(prefix="sgd-horovod-build-") as tmp:
            work = Path(tmp)
            sdist = download_sdist(version, work / "sdist", constraints)
            source = unpack(sdist, work / "src")
            patch(source)
            built = build_wheel(source, work / "wheel", cmake)
            if force:
                for old in slot.glob("horovod-*.whl"):
                    old.unlink()
            wheel = store(built, slot)
        log(f"built {wheel.name} in {time.monotonic() - start:.0f}s")
        return wheel


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--horovod-version", default=HOROVOD_VERSION, help="default %(default)s")
    parser.add_argument("--cache-dir", help="default $SGD_WHEEL_CACHE or ~/.cache/sgd/wheels")
    parser.add_argument("--force", action="store_true", help="build again even if a cached wheel exists")
    parser.add_argument("--install", action="store_true", help="pip-install the wheel into this Python")
    parser.add_argument("-c", "--constraint", action="append", default=[], metavar="FILE",
                        help="pip constraints for every install this script does (repeatable)")
    args = parser.parse_args(argv)
    constraints = [arg for c in args.constraint for arg in ("-c", c)]
    try:
        wheel = get_wheel(args.horovod_version, cache_dir(args.cache_dir), args.force, constraints)
        if args.install:
            run(pip("install", *constraints, str(wheel)))
    except BuildError as exc:
        log(f"error: {exc}")
        return 1
    print(wheel, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
