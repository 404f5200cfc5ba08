"""scripts/build_horovod.py: cache layout, reuse of a cached wheel, the sdist patches, atomic store.

The real build (minutes) is what `nox -s tests` runs before the tests; here only the parts
that decide whether to build and what to change.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build_horovod.py"


@pytest.fixture(scope="module")
def build():
    spec = importlib.util.spec_from_file_location("build_horovod", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_cached_wheel_is_printed_without_building(build, tmp_path):
    torch_version = build.torch_version()
    slot = build.slot_for(tmp_path, build.HOROVOD_VERSION, torch_version)
    assert slot.relative_to(tmp_path).parts[:2] == (f"horovod-{build.HOROVOD_VERSION}",
                                                     f"torch-{torch_version.replace('+', '_')}")
    assert slot.name == build.python_tag() and slot.name.startswith(f"cp{sys.version_info[0]}{sys.version_info[1]}-")
    slot.mkdir(parents=True)
    wheel = slot / f"horovod-{build.HOROVOD_VERSION}-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"not really a wheel")
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60,
                         env={"SGD_WHEEL_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(wheel)  # stdout is the path and nothing else
    assert "cached wheel" in out.stderr


def test_other_torch_or_horovod_versions_have_their_own_slot(build, tmp_path):
    a = build.slot_for(tmp_path, "0.28.1", "2.13.0+cpu")
    assert a != build.slot_for(tmp_path, "0.28.1", "2.12.0+cpu")
    assert a != build.slot_for(tmp_path, "0.28.0", "2.13.0+cpu")
    assert build.cached_wheel(a) is None


def _fake_sdist(root: Path) -> None:
    files = {
        "CMakeLists.txt": "project(horovod CXX)\nset(CMAKE_CXX_STANDARD 14)\n",
        "horovod/torch/CMakeLists.txt": 'if(NOT Pytorch_VERSION VERSION_LESS "1.5.0")\n'
                                        "    set(CMAKE_CXX_STANDARD 14)\nendif()\n",
        "third_party/gloo/CMakeLists.txt": '  set(CMAKE_CXX_FLAGS "${CMAKE_CXX_FLAGS} -std=c++11 -fPIC")\n',
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_patch_raises_the_cxx_standard_to_17(build, tmp_path):
    _fake_sdist(tmp_path)
    build.patch(tmp_path)
    assert "set(CMAKE_CXX_STANDARD 17)" in (tmp_path / "CMakeLists.txt").read_text()
    assert "set(CMAKE_CXX_STANDARD 17)" in (tmp_path / "horovod/torch/CMakeLists.txt").read_text()
    assert "-std=c++17 -fPIC" in (tmp_path / "third_party/gloo/CMakeLists.txt").read_text()
    with pytest.raises(build.BuildError, match="cannot patch CMakeLists.txt.*update PATCHES"):
        build.patch(tmp_path)  # already patched: an sdist it does not know fails loudly


def test_store_is_atomic_and_leaves_no_partial_file(build, tmp_path):
    src = tmp_path / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    src.write_bytes(b"wheel bytes")
    slot = tmp_path / "cache" / "slot"
    stored = build.store(src, slot)
    assert stored == slot / src.name and stored.read_bytes() == b"wheel bytes"
    assert [p.name for p in slot.iterdir()] == [src.name]


def test_cmake_versions_outside_3_13_to_4_are_rejected(build, tmp_path):
    fake = tmp_path / "cmake"
    fake.write_text("#!/bin/sh\necho 'cmake version 4.1.0'\n")
    fake.chmod(0o755)
    assert build.cmake_version(str(fake)) == (4, 1)
    assert not (build.MIN_CMAKE <= build.cmake_version(str(fake)) < build.MAX_CMAKE)
    assert build.MIN_CMAKE <= (3, 25) < build.MAX_CMAKE
    assert build.cmake_version(str(tmp_path / "missing")) is None


def test_without_torch_it_says_what_to_do(build, monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    with pytest.raises(build.BuildError, match="torch is not installed.*Install torch first"):
        build.torch_version()
