"""Every Python block of README.md and docs/*.md runs, so a page that goes wrong fails CI.

The rules (docs/contributing-docs.md says the same to authors):

- Every ```` ```python ```` block is executed, in page order, on the session's Ray cluster, with a
  fresh working directory. Line numbers in a traceback are the page's own.
- HTML comments directly above a block's fence (invisible on the site) are directives:

  ``<!-- docs-test: skip: REASON -->``
      not run; the reason is required and shows in pytest's skip summary.
  ``<!-- docs-test: continue -->``
      runs in the namespace and working directory of the page's previous block (a fragment that
      goes on from it); a chain of such blocks is one test.
  ``<!-- docs-test: setup`` … ``-->`` / ``<!-- docs-test: after`` … ``-->``
      hidden Python run before / after the block in its namespace: names a fragment takes for
      granted (a started ``trainer``) and calls that exercise what it only defines.
  ``<!-- docs-test: file: PATH -->``
      the block (any language) is written to PATH in the working directory instead of run.
  ``<!-- docs-test: signature: DOTTED.NAME -->``
      the block is a signature (``def f(a, b) -> T`` or a call with defaults); its parameter
      names, kinds and written defaults must match the object's.
  ``<!-- docs-test: same-as: FILE INDEX -->``
      the block must equal block INDEX of FILE, which runs there.
  ``<!-- docs-test: requires: MODULE -->``
      skipped when MODULE cannot be imported (a framework CI builds, not every machine has).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)\s*$")
DIRECTIVE = re.compile(r"^<!-- docs-test: ([a-z-]+)(?::\s*(.*?))?\s*(-->)?$")
KINDS = {"skip", "continue", "setup", "after", "file", "signature", "same-as", "requires"}
MISSING_PREFIX = re.compile(r"^<!--\s*(" + "|".join(sorted(KINDS)) + r")\b")


@dataclass
class Block:
    page: str  # relative to the repository root
    index: int  # among the page's python blocks, from 0
    line: int  # the line of the opening fence, from 1
    lang: str
    code: str
    directives: Dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _directives(lines: List[str], fence: int, where: str) -> Dict[str, str]:
    """The directive comments stacked directly above the fence at ``lines[fence]``."""
    found: Dict[str, str] = {}
    i = fence - 1
    while i >= 0 and lines[i].rstrip().endswith("-->"):
        end = i
        while not lines[i].startswith("<!--"):
            i -= 1
            assert i >= 0, f"{where}: unterminated comment"
        match = DIRECTIVE.match(lines[i].rstrip())
        if match is None:
            assert not lines[i].startswith("<!-- docs-test"), f"{where}: malformed directive {lines[i]!r}"
            # `<!-- skip: ... -->` without the prefix would silently run the block.
            assert not MISSING_PREFIX.match(lines[i]), (
                f"{where}: {lines[i]!r} is not a directive; write `<!-- docs-test: ...`"
            )
            break
        kind, value, closed = match.groups()
        assert kind in KINDS, f"{where}: unknown docs-test directive {kind!r} (known: {sorted(KINDS)})"
        body = "" if closed else "\n".join(lines[i + 1 : end])
        found[kind] = body if kind in ("setup", "after") else (value or "")
        i -= 1
    return found


def collect(page: Path) -> List[Block]:
    """The python blocks of one page, and the other blocks that carry a ``file`` directive."""
    lines = page.read_text().split("\n")
    rel = str(page.relative_to(ROOT))
    blocks: List[Block] = []
    index = 0
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = i + 1
        while not lines[end].startswith("```"):
            end += 1
        lang = match.group(1)
        directives = _directives(lines, i, f"{rel}:{i + 1}")
        if lang == "python" or directives:
            blocks.append(Block(rel, index if lang == "python" else -1, i + 1, lang,
                                "\n".join(lines[i + 1 : end]), directives))
            index += lang == "python"
        i = end + 1
    return blocks


def chains() -> List[List[Block]]:
    """Blocks grouped into tests: a ``continue`` block joins the chain of the block before it."""
    out: List[List[Block]] = []
    for page in PAGES:
        for block in collect(page):
            if "continue" in block.directives and out and out[-1][0].page == block.page:
                out[-1].append(block)
            else:
                out.append([block])
    return out


CHAINS = chains()


def _chain_id(chain: List[Block]) -> str:
    first, last = chain[0], chain[-1]
    return f"{first.page}:{first.line}" + (f"-{last.line}" if len(chain) > 1 else "")


def _exec(code: str, page: str, line: int, namespace: Dict[str, Any]) -> None:
    # Padded so that a traceback's line numbers are the page's.
    exec(compile("\n" * line + code, page, "exec"), namespace)


def _check_signature(block: Block, target: str) -> None:
    module_name, _, attr = target.rpartition(".")
    obj = getattr(importlib.import_module(module_name), attr)
    expected = inspect.signature(obj)
    source = block.code.strip()
    # `*,` marks keyword-only parameters in a signature; a call cannot hold it, so it is noted
    # and taken out before parsing.
    keyword_only = "*," in source
    source = source.replace("*,", "")
    tree = ast.parse(source + ": ...") if source.startswith("def ") else ast.parse(source)
    node = tree.body[0]
    if isinstance(node, ast.FunctionDef):
        written = [(a.arg, "POSITIONAL_OR_KEYWORD") for a in node.args.args]
        written += [(a.arg, "KEYWORD_ONLY") for a in node.args.kwonlyargs]
        assert [name for name, _ in written] == list(expected.parameters), (
            f"{block.where}: the signature of {target} has {list(expected.parameters)}, the page shows "
            f"{[name for name, _ in written]}"
        )
        return
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Call), f"{block.where}: not a signature"
    # A call written with every parameter as name=default.
    names = [kw.arg for kw in node.value.keywords]
    assert names == list(expected.parameters), (
        f"{block.where}: {target} takes {list(expected.parameters)}, the page shows {names}"
    )
    for kw in node.value.keywords:
        param = expected.parameters[str(kw.arg)]
        assert ast.literal_eval(kw.value) == param.default, (
            f"{block.where}: {target}({kw.arg}=...) defaults to {param.default!r}, the page says "
            f"{ast.unparse(kw.value)}"
        )
    kinds = [p.kind is inspect.Parameter.KEYWORD_ONLY for p in expected.parameters.values()]
    assert keyword_only == any(kinds), f"{block.where}: `*,` (keyword-only parameters) as in {target}"


def _block_source(page: str, index: int) -> Optional[str]:
    for block in collect(ROOT / page):
        if block.index == index and block.lang == "python":
            return block.code
    return None


def _plugin_names() -> List[Tuple[str, int]]:
    from sgd import plugins

    return [(name, id(plugin)) for name, plugin in plugins.get_plugin_manager().list_name_plugin()]


@pytest.mark.timeout(600)  # a chain can hold a few end-to-end runs (a Tune search: two trials)
@pytest.mark.parametrize("chain", CHAINS, ids=[_chain_id(c) for c in CHAINS])
def test_doc_block(chain: List[Block], ray_cluster, tmp_path, monkeypatch) -> None:
    """Run one block (or a chain of fragments) as a reader would paste it."""
    for block in chain:
        if "requires" in block.directives:
            pytest.importorskip(block.directives["requires"], reason=f"{block.where} needs it")
    runnable = [b for b in chain if "skip" not in b.directives]
    for block in chain:
        if "skip" in block.directives:
            assert block.directives["skip"], f"{block.where}: a skipped block says why"
    if not runnable:
        pytest.skip(f"{chain[0].where}: {chain[0].directives['skip']}")
    from sgd import plugins

    monkeypatch.chdir(tmp_path)
    # Blocks that start a subprocess (`sgd run`) hand it the session's cluster.
    import ray

    monkeypatch.setenv("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    # A Tune search pasted as a reader would writes into Ray's default storage (~/ray_results,
    # computed when Ray is imported): into this test's folder instead. RunConfig reads the
    # constant when it is made, tune.run's Experiment when its module was imported.
    import ray.train.constants
    import ray.tune.experiment.experiment

    results = str(tmp_path / "ray_results")
    monkeypatch.setattr(ray.train.constants, "DEFAULT_STORAGE_PATH", results)
    monkeypatch.setattr(ray.tune.experiment.experiment, "DEFAULT_STORAGE_PATH", results)
    namespace: Dict[str, Any] = {"__name__": "__sgd_docs__"}
    registered = _plugin_names()
    from sgd.worker_group.keep import KEPT, keep_workers

    kept = KEPT.max_idle()  # a page that shows sgd.keep_workers changes it
    try:
        for block in runnable:
            d = block.directives
            if "same-as" in d:
                page, index = d["same-as"].split()
                assert block.code == _block_source(page, int(index)), (
                    f"{block.where} must equal block {index} of {page}, which is the one run"
                )
                continue
            if "signature" in d:
                _check_signature(block, d["signature"])
                continue
            if "setup" in d:
                _exec(d["setup"], f"{block.page} (setup above line {block.line})", 0, namespace)
            if "file" in d:
                path = tmp_path / d["file"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.code + "\n")
                if block.lang == "python":
                    compile("\n" * block.line + block.code, block.page, "exec")
            else:
                _exec(block.code, block.page, block.line, namespace)
            if "after" in d:
                _exec(d["after"], f"{block.page} (after line {block.line})", 0, namespace)
    finally:
        if _plugin_names() != registered:  # a block registered a plugin by hand
            plugins.reset()
        if KEPT.max_idle() != kept:
            keep_workers(kept)


def test_every_skip_has_a_reason_and_directives_are_placed() -> None:
    """The collector sees every python block of every page, and each skip says why."""
    total = sum(1 for page in PAGES for b in collect(page) if b.lang == "python")
    fences = sum(page.read_text().count("\n```python\n") for page in PAGES)
    assert total == fences > 0
    for chain in CHAINS:
        for block in chain:
            if "skip" in block.directives:
                assert len(block.directives["skip"]) > 10, f"{block.where}: say why it is skipped"
            if "continue" in block.directives:
                assert block is not chain[0], f"{block.where}: `continue` on a page's first block"


if __name__ == "__main__":  # pragma: no cover - a listing for authors
    for c in CHAINS:
        print(_chain_id(c), [sorted(b.directives) for b in c])
    sys.exit(0)
