"""The page's files, read as files (no browser needed): the vendored uPlot is the one pinned in
VENDORED.md, nothing refers to another host, and nothing needs the CSP's 'unsafe-inline' or
'unsafe-eval' or builds markup from strings."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

STATIC = Path(__file__).resolve().parents[2] / "src" / "sgd_dashboard" / "static"
VENDOR = STATIC / "vendor" / "uplot"
OWN = sorted([STATIC / "index.html", STATIC / "app.js", STATIC / "app.css", STATIC / "favicon.svg",
              *(STATIC / "js").glob("*.js")])
#: URLs that may appear in the files and are never fetched: the SVG namespace and the comment at
#: the top of uPlot's file naming its home.
NOT_FETCHED = {"http://www.w3.org/2000/svg", "https://github.com/leeoniya/uPlot"}


def _pinned():
    text = (VENDOR / "VENDORED.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", text, re.M)
    assert rows, "VENDORED.md has no table of files and their sha256"
    return dict(rows)


def test_vendored_uplot_is_the_pinned_release():
    pinned = _pinned()
    assert set(pinned) == {"uPlot.iife.min.js", "uPlot.min.css", "LICENSE"}
    on_disk = {p.name for p in VENDOR.iterdir()} - {"VENDORED.md"}
    assert on_disk == set(pinned), f"files in vendor/uplot not pinned in VENDORED.md: {on_disk ^ set(pinned)}"
    for name, digest in pinned.items():
        got = hashlib.sha256((VENDOR / name).read_bytes()).hexdigest()
        assert got == digest, (f"vendor/uplot/{name} changed (sha256 {got}, VENDORED.md pins {digest}): copy it "
                               "again from the npm package VENDORED.md names, or update the pin with the version")
    assert "1.6.32" in (VENDOR / "uPlot.iife.min.js").read_text()[:100]
    assert "MIT License" in (VENDOR / "LICENSE").read_text()


@pytest.mark.parametrize("path", [*OWN, VENDOR / "uPlot.min.css", VENDOR / "uPlot.iife.min.js"],
                         ids=lambda p: str(p.relative_to(STATIC)))
def test_no_file_refers_to_another_host(path):
    text = path.read_text()
    urls = set(re.findall(r"[a-z][a-z0-9+.-]*://[^\s\"'()<>]+", text, re.I)) - NOT_FETCHED
    assert urls == set(), f"{path.name} names other hosts: {sorted(urls)}"
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?//""", text), f"{path.name}: a protocol-relative URL"
    for target in re.findall(r"url\(\s*['\"]?([^'\")]+)", text):
        assert target.startswith(("data:", "#")) or "//" not in target, f"{path.name}: url({target})"
    assert not re.search(r"@import", text), f"{path.name}: @import"


def test_the_page_needs_no_inline_script_or_style():
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<style", html, re.I)
    assert not re.search(r"\sstyle\s*=", html, re.I)
    assert not re.search(r"\son[a-z]+\s*=", html, re.I), "an inline event handler"
    for match in re.finditer(r"<script([^>]*)>(.*?)</script>", html, re.S | re.I):
        assert "src=" in match.group(1) and not match.group(2).strip(), "an inline script"
    for ref in re.findall(r"""(?:src|href)="(/static/[^"]+)\"""", html):
        assert (STATIC / ref[len("/static/"):]).is_file(), f"index.html refers to a missing file {ref}"


@pytest.mark.parametrize("path", [p for p in OWN if p.suffix == ".js"], ids=lambda p: p.name)
def test_scripts_build_the_page_from_nodes(path):
    code = re.sub(r"//[^\n]*", "", path.read_text())  # comments may name what is not done
    for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                   "setAttribute(\"style\"", ".cssText"):
        assert banned not in code, f"{path.name} uses {banned}"
    for imported in re.findall(r"""from\s+["'](\.[^"']+)["']""", code):
        assert (path.parent / imported).resolve().is_file(), f"{path.name} imports a missing {imported}"
