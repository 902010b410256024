"""Sphinx configuration of the airflow-azureml docs site (``make docs``).

Sphinx, as Apache Airflow's own providers use: ``autodoc`` reads the docstrings, ``literalinclude``
pulls the how-to snippets out of the example DAGs (never copied), and ``myst-parser`` renders the
Markdown guides in ``docs/`` as they are, so each text lives in one place. ``make docs`` builds with
``-W --keep-going``: a broken include marker, a missing page or a bad docstring fails the build.
"""

from __future__ import annotations

import pkgutil
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

project = "airflow-azureml"
author = "airflow-azureml contributors"
copyright = "2026, airflow-azureml contributors"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "**/_build"]
# The guides' "## Section" headings become link targets (``operators.md#azuremldeletecomputeoperator``).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

autodoc_default_options = {"members": True, "show-inheritance": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autoclass_content = "both"

html_theme = "alabaster"
html_title = "airflow-azureml"
html_theme_options = {"description": "Apache Airflow provider for Azure Machine Learning", "fixed_sidebar": True}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def blank_lines_around_lists(lines: list[str]) -> list[str]:
    """The docstrings write lists as plain text reads best (no blank line before or after a list);
    reStructuredText needs those blank lines, so they are added here rather than in every docstring.
    """
    out: list[str] = []
    list_indent: int | None = None
    for line in lines:
        stripped = line.strip()
        is_item = stripped.startswith(("- ", "* "))
        if list_indent is not None and stripped and not is_item and _indent(line) <= list_indent:
            out.append("")  # the list ended without a blank line
            list_indent = None
        if is_item and list_indent is None:
            if out and out[-1].strip():
                out.append("")  # the list began without a blank line
            list_indent = _indent(line)
        elif not stripped:
            list_indent = None
        out.append(line)
    return out


def unlisted_modules(api_dir: Path) -> list[str]:
    """Provider modules that no ``automodule`` in ``docs/api`` names (the emulator's internals aside).

    They are added to the "Shared building blocks" page as it is read, so a new module is in the API
    reference without an edit here.
    """
    import airflow_azureml

    listed = set()
    for page in api_dir.glob("*.rst"):
        listed.update(re.findall(r"^\.\. automodule:: (\S+)", page.read_text(), re.MULTILINE))
    found = (m.name for m in pkgutil.walk_packages(airflow_azureml.__path__, "airflow_azureml.") if not m.ispkg)
    return sorted(m for m in found if m not in listed and not m.startswith("airflow_azureml.emulator."))


def _add_unlisted_modules(app: object, docname: str, source: list[str]) -> None:
    if docname == "api/core":
        api_dir = Path(app.srcdir) / "api"  # type: ignore[attr-defined]
        source[0] += "".join(f"\n.. automodule:: {name}\n" for name in unlisted_modules(api_dir))


def _process_docstring(app: object, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
    lines[:] = blank_lines_around_lists(lines)


def setup(app: object) -> None:
    app.connect("autodoc-process-docstring", _process_docstring)  # type: ignore[attr-defined]
    app.connect("source-read", _add_unlisted_modules)  # type: ignore[attr-defined]
