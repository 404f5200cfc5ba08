"""The package README's Python blocks run (tests/test_docs.py runs the repository's pages, not
the packages' READMEs); a block under ``<!-- docs-test: skip: REASON -->`` is left out."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"(?:^(<!-- docs-test: skip: [^\n]+ -->)\n)?^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_readme_blocks_run(ray_cluster, tmp_path, monkeypatch):
    blocks = BLOCK.findall(README.read_text())
    assert len(blocks) == 2 and blocks[1][0]  # the serving block says why it does not run
    monkeypatch.chdir(tmp_path)
    for skip, code in blocks:
        if not skip:
            exec(compile(code, str(README), "exec"), {"__name__": "__readme__"})
