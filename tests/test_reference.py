"""Every public name of every package has an entry in the API reference (docs/reference/).

A public name is one in a package's ``__all__`` (and the public submodules ``sgd_torch.v1``,
``sgd_torch.huggingface`` and ``sgd_torch.lightning``). An entry is a mkdocstrings line
``::: dotted.path`` whose last part is the name and which resolves to the very object the
package exports under it (lazily exported names are documented at their defining module).
The site build (``nox -s docs``) fails on an entry that names nothing; this test fails on a
public name that has no entry.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["sgd", "sgd.collective", "sgd.utils", "sgd.codecs", "sgd.redact", "sgd.errors", "sgd.elastic",
            "sgd_torch", "sgd_torch.v1", "sgd_torch.elastic", "sgd_torch.huggingface", "sgd_torch.lightning",
            "sgd_torch.huggingface.transformers", "sgd_tensorflow", "sgd_tensorflow.keras", "sgd_horovod",
            "sgd_loggers", "sgd_tune", "sgd_testing", "sgd_xgboost.xgboost", "sgd_xgboost.lightgbm"]
ENTRY = re.compile(r"^::: ([\w.]+)\s*$", re.M)

# Run in a subprocess: resolving the lazy names imports TensorFlow, transformers, Lightning and
# Ray Tune, which the test session's own process should not carry.
CHECK = r"""
import importlib, json, sys

def resolve(path):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(path)

packages, entries = json.loads(sys.stdin.read())
resolved = {path: id(resolve(path)) for path in entries}
missing = []
for name in packages:
    module = importlib.import_module(name)
    for public in module.__all__:
        target = id(getattr(module, public))
        if not any(p.rsplit(".", 1)[-1] == public and resolved[p] == target for p in entries):
            missing.append(f"{name}.{public}")
print(json.dumps({"missing": missing, "entries": len(entries)}))
"""


def _entries():
    return sorted({m for page in (ROOT / "docs" / "reference").glob("*.md") for m in ENTRY.findall(page.read_text())})


def test_every_public_name_has_a_reference_entry():
    entries = _entries()
    out = subprocess.run([sys.executable, "-c", CHECK], input=json.dumps([PACKAGES, entries]),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["missing"] == [], f"public names without an entry in docs/reference/: {result['missing']}"
    assert result["entries"] == len(entries) >= 80


def test_reference_pages_are_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs" / "reference").glob("*.md"):
        assert f"reference/{page.name}" in nav, page.name
    assert "::: sgd.hookspecs" in (ROOT / "docs" / "reference" / "hookspecs.md").read_text()
