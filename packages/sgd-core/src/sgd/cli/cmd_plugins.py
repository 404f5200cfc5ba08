"""``sgd plugins``: every loaded plugin, its version and what it provides, the plugins that
failed to load and the backend names two plugins claim."""

from __future__ import annotations

import argparse
import importlib.metadata
import itertools
import json
import textwrap
from typing import Any, Dict, List, Optional

from sgd import plugins


def _version(dist: Optional[str]) -> str:
    if not dist:
        return "-"
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _answers(pm: Any, hook_name: str) -> Dict[str, List[Any]]:
    """Plugin name → what its implementation of a discovery hook returns ([] if it fails), each
    plugin asked on its own through pluggy (:func:`sgd.plugins.ask_each`)."""
    return {answer.plugin: [item for value in answer.values for item in (value or [])]
            for answer in plugins.ask_each(pm, hook_name) if answer.error is None}


def plugin_table() -> List[Dict[str, Any]]:
    """One record per loaded plugin: name, distribution, version, what it provides."""
    pm = plugins.get_plugin_manager()
    backends = plugins.available_backends()
    declared = {hook: _answers(pm, hook)
                for hook in ("sgd_backends", "sgd_callbacks", "sgd_checkpoint_storage_schemes")}
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = plugins.plugin_distribution(name)
        provided_backends = [s.name for s in declared["sgd_backends"].get(name, [])]
        callbacks = [c.__name__ for c in declared["sgd_callbacks"].get(name, [])]
        schemes = [str(s) for s in declared["sgd_checkpoint_storage_schemes"].get(name, [])]
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        rows.append(
            {
                "name": name,
                "distribution": dist,
                "version": _version(dist),
                "backends": [b for b in provided_backends if b in backends],
                "callbacks": callbacks,
                "storage": schemes,
                "hooks": hooks,
            }
        )
    return rows


#: ``sgd plugins`` keeps every line within this many columns.
TABLE_WIDTH = 100


def _wrap(text: str, indent: str, width: int = TABLE_WIDTH) -> List[str]:
    """``text`` wrapped at ``width`` on ", " and spaces; continuation lines start with ``indent``."""
    return textwrap.wrap(text, width, subsequent_indent=indent, break_on_hyphens=False) or [text]


def format_plugin_table(rows: List[Dict[str, Any]], width: int = TABLE_WIDTH) -> List[str]:
    """The lines of ``sgd plugins``: one row per plugin (name, version, backends, storage schemes),
    its callbacks on the lines under it, every line at most ``width`` columns.

    A cell wider than its column wraps within the column: the first three columns are capped
    (at 24, 12 and 24 characters), the storage column takes the rest.

    :param rows: records as :func:`plugin_table` returns them.
    :param width: the widest line allowed (at least 80).
    """
    header = ("plugin", "version", "backends", "storage")
    cells = [
        (str(r["name"]), str(r["version"]), ", ".join(r["backends"]) or "-", ", ".join(r["storage"]) or "-")
        for r in rows
    ]
    widths = [min(max(len(row[i]) for row in cells + [header]), cap) for i, cap in enumerate((24, 12, 24))]
    widths.append(width - sum(widths) - 2 * len(widths))
    lines = []
    for record, row in zip([None, *rows], [header, *cells]):
        wrapped = [textwrap.wrap(cell, w, break_on_hyphens=False) or [cell] for cell, w in zip(row, widths)]
        for parts in itertools.zip_longest(*wrapped, fillvalue=""):
            lines.append("  ".join(part.ljust(w) for part, w in zip(parts, widths)).rstrip())
        if record is not None and record["callbacks"]:
            lines.extend(_wrap("  callbacks: " + ", ".join(record["callbacks"]), "    ", width))
    return lines


def cmd_plugins(args: argparse.Namespace) -> int:
    rows = plugin_table()
    failures = plugins.load_failures()
    conflicts = plugins.backend_conflicts()
    if args.json:
        print(
            json.dumps(
                {
                    "plugins": rows,
                    "failed": [f.__dict__ for f in failures],
                    "conflicts": conflicts,
                },
                indent=2,
            )
        )
        return 0
    for line in format_plugin_table(rows):
        print(line)
    for name, providers in conflicts.items():
        print()
        print(*_wrap(f"conflict: backend {name!r} is provided by {', '.join(providers)}", "    "), sep="\n")
    if failures:
        print("\nfailed to load:")
        for f in failures:
            print(*_wrap(f"  {f.name} ({f.distribution or '?'}): {f.reason}", "      "), sep="\n")
    return 0
