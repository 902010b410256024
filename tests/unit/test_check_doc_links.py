"""scripts/check_doc_links.py, run by ``make docs``: the repository's own docs pass, broken links fail."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("check_doc_links", ROOT / "scripts" / "check_doc_links.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_repository_docs_have_no_broken_internal_link() -> None:
    broken, external = load().check(ROOT)
    assert broken == []
    assert all("://" in line or "mailto:" in line for line in external)


def test_a_missing_page_a_missing_anchor_and_a_missing_file_are_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n\n## Azure roles\n\n## `make docs` and links\n\n## Azure roles\n\n"
        "[ok](#azure-roles) [ok](#azure-roles-1) [ok](#make-docs-and-links) [ok](other.md#target)\n"
        "[bad](#no-such-anchor) [bad](missing.md) [bad](other.md#nowhere)\n"
        "```bash\n[not a link](nowhere.md)\n```\n"
        "`[not a link either](nowhere.md)` and [web](https://example.com/page)\n"
    )
    (tmp_path / "docs" / "other.md").write_text("(target)=\n# Other\n")
    (tmp_path / "README.md").write_text("[guide](docs/guide.md#guide) [bad](docs/guide.md#missing) [dir](docs/)\n")
    broken, external = load().check(tmp_path)
    assert [line.split(": ", 1)[1] for line in broken] == [
        "docs/guide.md#missing: no heading or target 'missing' in docs/guide.md",
        "#no-such-anchor: no heading or target 'no-such-anchor' in docs/guide.md",
        "missing.md: no file 'missing.md'",
        "other.md#nowhere: no heading or target 'nowhere' in other.md",
    ]
    assert external == ["docs/guide.md:14: https://example.com/page"]
    assert load().main(["--root", str(tmp_path)]) == 1
