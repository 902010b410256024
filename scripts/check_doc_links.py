"""Check the internal links of the Markdown docs; list the external ones without fetching them.

``make docs`` runs it before Sphinx. For README.md and every ``docs/**/*.md`` (``docs/_build`` aside):

- a relative link (``cost.md``, ``../dags/x.py``, ``docs/``) must name a file or folder that exists;
- an anchor (``#azure-roles``, ``cost.md#prices``) must be a heading of that Markdown file, as MyST
  makes its ids (``myst_heading_anchors = 3`` in docs/conf.py: levels 1-3, GitHub-style slugs, ``-1``,
  ``-2`` for repeats), or an explicit ``(label)=`` target or ``<a id="...">``/``<a name="...">``;
- ``http(s)://`` and ``mailto:`` links are printed, one per line with where they are, and never fetched.

Links inside fenced code blocks and inline code are not links. Exit status 1 when any internal link is
broken, each one printed as ``file:line: ...``.

    python scripts/check_doc_links.py            # the repository this script is in
    python scripts/check_doc_links.py --root DIR  # another tree with README.md and docs/
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from urllib.parse import unquote

HEADING_LEVELS = 3  # docs/conf.py: myst_heading_anchors
EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:)")  # http:, https:, mailto:, ... (any scheme)
FENCE = re.compile(r"^\s*(```+|~~~+)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
# [text](target "title") and ![alt](target); the target may be <bracketed>
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)")
AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_TARGET = re.compile(r"^\(([^)]+)\)=\s*$")
HTML_ID = re.compile(r"<a\s+[^>]*(?:id|name)=\"([^\"]+)\"")


def slugify(title: str) -> str:
    """MyST's heading id (mdit_py_plugins.anchors.slugify) of a heading's text."""
    return re.sub(r"[^\w\u4e00-\u9fff\- ]", "", title.lower().replace(" ", "-"))


def heading_text(raw: str) -> str:
    """The text MyST slugs: text and inline code, without the Markdown around them."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)  # a link's text
    text = INLINE_CODE.sub(lambda m: m.group(2).strip(), text)
    return re.sub(r"(\*\*|__|\*|_)(\S.*?\S|\S)\1", r"\2", text)  # emphasis markers


def lines_outside_code(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of the lines not inside a fenced code block."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = FENCE.match(line)
        if match:
            marker = match.group(1)
            if fence is None:
                fence = marker[0] * len(marker)
                continue
            if marker.startswith(fence):
                fence = None
                continue
        if fence is None:
            out.append((number, line))
    return out


def anchors(path: Path) -> set[str]:
    """Every id a link may name in ``path``."""
    ids: set[str] = set()
    for _, line in lines_outside_code(path):
        heading = HEADING.match(line)
        if heading and len(heading.group(1)) <= HEADING_LEVELS:
            slug = base = slugify(heading_text(heading.group(2)))
            count = 0
            while slug in ids:
                count += 1
                slug = f"{base}-{count}"
            ids.add(slug)
        target = EXPLICIT_TARGET.match(line)
        if target:
            ids.add(target.group(1).strip())
        ids.update(HTML_ID.findall(line))
    return ids


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link in ``path`` outside code."""
    found: list[tuple[int, str]] = []
    for number, line in lines_outside_code(path):
        bare = INLINE_CODE.sub("", line)
        found.extend((number, m.group(1).strip("<>")) for m in INLINE_LINK.finditer(bare))
        found.extend((number, m.group(1)) for m in AUTOLINK.finditer(bare))
        ref = REFERENCE_DEF.match(bare)
        if ref:
            found.append((number, ref.group(1).strip("<>")))
    return found


def markdown_files(root: Path) -> list[Path]:
    files = [root / "README.md"] if (root / "README.md").exists() else []
    docs = root / "docs"
    if docs.is_dir():
        files += sorted(p for p in docs.rglob("*.md") if "_build" not in p.relative_to(docs).parts)
    return files


def check(root: Path) -> tuple[list[str], list[str]]:
    """(broken internal links, external links), each a line ``file:line: ...``."""
    root = root.resolve()
    broken: list[str] = []
    external: list[str] = []
    cache: dict[Path, set[str]] = {}
    for source in markdown_files(root):
        where = source.relative_to(root)
        for number, target in links(source):
            if EXTERNAL.match(target):
                external.append(f"{where}:{number}: {target}")
                continue
            page, _, fragment = target.partition("#")
            page, fragment = unquote(page), unquote(fragment)
            dest = (source.parent / page).resolve() if page else source
            if not dest.exists():
                broken.append(f"{where}:{number}: {target}: no file {page!r}")
                continue
            if fragment:
                if dest.suffix != ".md" or dest.is_dir():
                    broken.append(f"{where}:{number}: {target}: an anchor into a file that is not Markdown")
                    continue
                ids = cache.setdefault(dest, anchors(dest))
                if fragment not in ids:
                    broken.append(f"{where}:{number}: {target}: no heading or target {fragment!r} in {page or where}")
    return broken, external


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    broken, external = check(args.root)
    print(f"External links ({len(external)}, listed, not fetched):")
    for line in external:
        print(f"  {line}")
    if broken:
        print(f"Broken internal links ({len(broken)}):", file=sys.stderr)
        for line in broken:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"Internal links: all resolve ({len(markdown_files(args.root.resolve()))} Markdown files).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
