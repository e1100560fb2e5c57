"""The book speaks to its readers about the paper and the code: no project bookkeeping
(issues, outstanding work, commit hashes, "-dirty" trees) on any page. Reads the built HTML
when the book has been built (CI builds it first), else the chapters' sources and outputs."""

import html
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILT = ROOT / "_build" / "html"
FORBIDDEN = {
    "an issue": re.compile(r"(?i)\bissues?\b"),
    "outstanding work": re.compile(r"(?i)\boutstanding\b"),
    "a dirty tree": re.compile(r"-dirty\b"),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}\b"),
    "a to-do": re.compile(r"\b(TODO|FIXME|XXX)\b"),
}


def built_pages():
    for path in sorted(BUILT.rglob("*.html")):
        parts = path.relative_to(BUILT).parts
        if parts[0][0] in "_." or path.name in ("genindex.html", "search.html"):
            continue
        text = path.read_text(encoding="utf-8")
        # the page's content, without the theme's header and buttons ("Open issue", ...)
        start, end = text.find("<article"), text.rfind("</article>")
        text = text[start:end] if start >= 0 < end else text
        text = re.sub(r"(?s)<(script|style)\b.*?</\1>", " ", text)  # code of the theme
        text = re.sub(r"(?s)<[^>]+>", " ", text)
        yield path.relative_to(ROOT), html.unescape(text)


def source_pages():
    for path in sorted([*ROOT.glob("chapters/*"), ROOT / "index.md", ROOT / "references.md"]):
        if path.suffix == ".md":
            yield path.relative_to(ROOT), path.read_text(encoding="utf-8")
        elif path.suffix == ".ipynb":
            texts = []
            for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
                if cell["cell_type"] == "markdown":
                    texts.append("".join(cell["source"]))
                for output in cell.get("outputs", []):
                    texts.append("".join(output.get("text", "")))
                    texts.append("".join(output.get("data", {}).get("text/plain", "")))
            yield path.relative_to(ROOT), "\n".join(texts)


def test_no_page_speaks_of_project_bookkeeping():
    pages = list(built_pages()) if BUILT.is_dir() else list(source_pages())
    assert len(pages) >= 20
    found = [
        f"{path}: {what}: ...{text[max(0, m.start() - 60) : m.end() + 40]!r}..."
        for path, text in pages
        for what, pattern in FORBIDDEN.items()
        for m in pattern.finditer(text)
    ]
    assert not found, "\n".join(found)
