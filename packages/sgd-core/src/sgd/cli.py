"""The ``sgd`` command (also ``python -m sgd``)."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from typing import Any, Dict, List, Optional

from sgd import plugins


def _version(dist: Optional[str]) -> str:
    if not dist:
        return "-"
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _answer(hook: Any, plugin_name: str) -> List[Any]:
    """What one plugin's implementation of a discovery hook returns ([] if none or it fails)."""
    for impl in hook.get_hookimpls():
        if impl.plugin_name == plugin_name:
            try:
                return list(impl.function() or [])
            except Exception:
                return []
    return []


def plugin_table() -> List[Dict[str, Any]]:
    """One record per loaded plugin: name, distribution, version, what it provides."""
    pm = plugins.get_plugin_manager()
    backends = plugins.available_backends()
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = plugins.plugin_distribution(name)
        provided_backends = [s.name for s in _answer(pm.hook.sgd_backends, name)]
        callbacks = [c.__name__ for c in _answer(pm.hook.sgd_callbacks, name)]
        schemes = [str(s) for s in _answer(pm.hook.sgd_checkpoint_storage_schemes, name)]
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


def _cmd_plugins(args: argparse.Namespace) -> int:
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
    header = ("plugin", "version", "backends", "callbacks", "storage")
    table = [
        (
            str(r["name"]),
            str(r["version"]),
            ", ".join(r["backends"]) or "-",  # type: ignore[arg-type]
            ", ".join(r["callbacks"]) or "-",  # type: ignore[arg-type]
            ", ".join(r["storage"]) or "-",  # type: ignore[arg-type]
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table + [header]) for i in range(len(header))]
    for row in [header] + table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    for name, providers in conflicts.items():
        print(f"\nconflict: backend {name!r} is provided by {', '.join(providers)}")
    if failures:
        print("\nfailed to load:")
        for f in failures:
            print(f"  {f.name} ({f.distribution or '?'}): {f.reason}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgd", description="sgd: distributed training on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_plugins)
    plugins.get_plugin_manager().hook.sgd_cli_commands(subparsers=sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
