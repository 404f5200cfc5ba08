"""The worker hosts' private folders (sgd_testing.host_mounts): private, with the interpreter, its
environment and the checkout still there, also when they lie under ``/tmp`` (a repository cloned
into ``/tmp`` has its ``.nox`` virtualenv there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from sgd_testing.host_mounts import in_private_namespace, private_mounts, shared_paths
from sgd_testing.hosts import namespaces_unavailable

_NO_NAMESPACES = namespaces_unavailable()


def test_only_shared_paths_inside_a_private_folder_are_mounted_back():
    commands = private_mounts(
        ["/tmp", "/dev/shm", "/tmp/nested"],
        ["/tmp/clone", "/tmp/clone/.nox/tests", "/usr", "/tmp", "/work/main", "/dev/shmx"],
        stage="/tmp/cluster/mounts", label="sgd-test",
    )
    binds = [c for c in commands if c.startswith("mount --rbind")]
    # the clone once (its venv comes with it); /tmp itself, and what is not hidden, never
    assert binds == ["mount --rbind /tmp/clone /tmp/cluster/mounts/0/clone"]
    moves = [c for c in commands if c.startswith("mount --move")]
    # /tmp/nested is private with /tmp; /tmp, which holds the staging folder, is covered last
    assert moves == ["mount --move /tmp/cluster/mounts/1 /dev/shm", "mount --move /tmp/cluster/mounts/0 /tmp"]
    with pytest.raises(ValueError, match="lies inside /tmp/clone"):
        private_mounts(["/tmp"], ["/tmp/clone"], stage="/tmp/clone/mounts", label="sgd-test")


def test_shared_paths_hold_the_interpreter_and_this_checkout():
    shared = shared_paths()
    checkout = next(p for p in Path(__file__).resolve().parents if (p / ".git").exists())
    for path in (sys.prefix, sys.base_prefix, os.getcwd(), str(checkout)):
        assert os.path.abspath(path) in shared


_CHECK = """
import json, os, sys
print(json.dumps({"prefix": sys.prefix, "tmp": os.listdir("/tmp"), "root": sorted(os.listdir(sys.argv[3])),
                  "shm": os.listdir("/dev/shm"), "shared_file": open(sys.argv[1]).read()}))
open(sys.argv[2], "w").write("written on the host")
"""


@pytest.mark.skipif(_NO_NAMESPACES is not None, reason=str(_NO_NAMESPACES))
def test_a_virtualenv_under_tmp_runs_in_a_host_namespace_whose_tmp_is_private():
    """A virtualenv made under the real /tmp (as a clone's .nox is): its interpreter runs in the
    namespace a worker host gets, sees the folders shared with it, and nothing else of /tmp."""
    root = Path(tempfile.mkdtemp(prefix="sgd-host-mounts-", dir="/tmp"))
    try:
        venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        # This environment's packages (sgd_testing and what it imports) seen from the new one.
        purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        Path(purelib, "outer.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
        # What a cluster driven by that interpreter would share.
        found = subprocess.run([python, "-c", "import json; from sgd_testing.host_mounts import shared_paths; "
                                "print(json.dumps(shared_paths()))"], capture_output=True, text=True, check=True)
        shared = json.loads(found.stdout)
        assert str(venv) in shared
        code = root / "code"  # a folder shared through HostCluster(shared=...), as a checkout is
        code.mkdir()
        (code / "module.py").write_text("VALUE = 1\n")
        (root / "only-on-the-driver").write_text("x")
        shm_marker = Path(tempfile.mkstemp(prefix="sgd-host-mounts-", dir="/dev/shm")[1])
        try:
            check = [python, "-c", _CHECK, str(code / "module.py"), str(code / "from-host"), str(root)]
            cmd = in_private_namespace(check, ["/tmp", "/dev/shm"], [*shared, str(code)], stage=str(root / "mounts"),
                                       label="sgd-test")
            seen = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        finally:
            shm_marker.unlink()
        assert seen["prefix"] == str(venv)
        # Of the real /tmp, only the shared paths (this checkout too, where it was cloned under /tmp).
        tops = {Path(p).relative_to("/tmp").parts[0] for p in [*shared, str(code)] if p.startswith("/tmp/")}
        assert set(seen["tmp"]) == tops and seen["root"] == ["code", "venv"]
        assert shm_marker.name not in seen["shm"]
        assert seen["shared_file"] == "VALUE = 1\n"
        assert (code / "from-host").read_text() == "written on the host"  # shared, not copied
        assert sorted(p.name for p in root.iterdir()) == ["code", "mounts", "only-on-the-driver", "venv"]
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
