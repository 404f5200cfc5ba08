"""What a worker host of :class:`sgd_testing.hosts.HostCluster` has of its own, and what it shares.

A worker host runs in a mount namespace of its own where ``/tmp``, ``/dev/shm`` and
``~/sgd_results`` are fresh, empty tmpfs mounts: its disk, not the driver's. The interpreter, its
environment and the code the driver runs must stay reachable there, as they are on the hosts of
a real cluster (installed alike on every machine), wherever they are: a checkout cloned under
``/tmp`` keeps its virtualenv (``.nox/tests``) and its sources under ``/tmp`` too, and a private
``/tmp`` that hid them would leave the host no ``ray`` to start.

So each private folder is made in a staging folder first: a tmpfs with the shared paths that
lie inside that folder bind-mounted into it at the same relative places, then moved over the
folder (``mount --move``). Nothing else of the real folder shows through.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Iterable, List, Sequence
from urllib.parse import unquote, urlparse


def shared_paths(extra: Iterable[str] = ()) -> List[str]:
    """The paths a worker host sees as the driver does, as this process is now: the
    interpreter's installations (``sys.prefix``, ``sys.base_prefix``, ...), the folders on
    ``sys.path``, the checkout of every package installed in editable mode, the working
    directory (Ray puts the driver's on its workers' ``sys.path``), and ``extra``."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.abspath(sys.executable)), os.getcwd(), *sys.path,
             *_editable_checkouts(), *extra]
    return sorted({os.path.abspath(p) for p in paths if p and os.path.exists(p)})


def _editable_checkouts() -> List[str]:
    """The folder of each distribution installed in editable mode (its ``direct_url.json``,
    PEP 610), widened to the checkout it is in (the nearest folder above with ``.git``)."""
    from importlib import metadata

    found = []
    for dist in metadata.distributions():
        try:
            info = json.loads(dist.read_text("direct_url.json") or "null")
        except ValueError:
            continue
        if not isinstance(info, dict) or not info.get("dir_info", {}).get("editable"):
            continue
        url = urlparse(str(info.get("url", "")))
        if url.scheme == "file":
            project = Path(unquote(url.path))
            found.append(str(next((p for p in (project, *project.parents) if (p / ".git").exists()), project)))
    return found


def _inside(path: str, folder: str) -> bool:
    """Whether ``path`` lies strictly inside ``folder`` (both absolute and normalised)."""
    return path != folder and path.startswith(folder.rstrip("/") + "/")


def private_mounts(private: Sequence[str], shared: Sequence[str], stage: str, label: str) -> List[str]:
    """Shell commands, to run inside a new mount namespace (``unshare -m --propagation private``),
    that mount a fresh tmpfs named ``label`` over each folder of ``private``, with the paths of
    ``shared`` that lie inside it mounted back. Shared paths elsewhere need nothing: they are not
    hidden.

    :param stage: an empty folder (made if missing) for the staging mounts, on the real disk;
        it must not lie inside a shared path.
    """
    folders = [os.path.abspath(f) for f in private]
    folders = [f for f in dict.fromkeys(folders) if not any(_inside(f, other) for other in folders)]
    stage = os.path.abspath(stage)
    hidden = {os.path.abspath(p) for p in shared if any(_inside(os.path.abspath(p), f) for f in folders)}
    hidden = {p for p in hidden if not any(_inside(p, other) for other in hidden)}  # the outermost only
    for path in hidden:
        if stage == path or _inside(stage, path):
            raise ValueError(f"the staging folder {stage} lies inside {path}, which the host shares; "
                             "give the cluster a base_dir elsewhere")
    q = shlex.quote
    commands, moves = [], []
    for i, folder in enumerate(folders):
        staged = os.path.join(stage, str(i))
        commands += [f"mkdir -p {q(staged)}", f"mount -t tmpfs {q(label)} {q(staged)}"]
        for path in sorted(p for p in hidden if _inside(p, folder)):
            target = os.path.join(staged, os.path.relpath(path, folder))
            if os.path.isdir(path):
                commands.append(f"mkdir -p {q(target)}")
            else:  # a file (a zip on sys.path): a bind mount needs a file to cover
                commands += [f"mkdir -p {q(os.path.dirname(target))}", f": > {q(target)}"]
            commands.append(f"mount --rbind {q(path)} {q(target)}")
        moves.append((folder, staged))
    # The folder that holds the staging area is covered last: the other staged mounts are
    # reached through it until then.
    moves.sort(key=lambda move: _inside(stage, move[0]))
    commands += [f"mount --move {q(staged)} {q(folder)}" for folder, staged in moves]
    return commands


def in_private_namespace(command: Sequence[str], private: Sequence[str], shared: Sequence[str], stage: str,
                         label: str) -> List[str]:
    """``command`` run in a mount namespace of its own (needs root) where each folder of
    ``private`` is a fresh tmpfs with the paths of ``shared`` inside it mounted back
    (:func:`private_mounts`)."""
    script = " && ".join([*private_mounts(private, shared, stage, label), f"exec {shlex.join(command)}"])
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
