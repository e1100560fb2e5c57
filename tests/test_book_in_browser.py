"""The built book as a reader's browser shows it: every page of _build/html opened in
headless Chromium, offline. Equations must be typeset by the bundled MathJax (no raw TeX
left), no page may show a traceback or request anything from elsewhere, and every internal
link must lead to a file.

Needs the built book (`jupyter-book build .`), Debian's chromium and Playwright; .ci/run
provides them and sets REQUIRE_BROWSER_TESTS=1 so that, in CI, their absence is a failure,
not a skip."""

import functools
import html.parser
import os
import pathlib
import re
import types
import urllib.parse

import pytest

import headless

ROOT = pathlib.Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
PAGES = sorted(HTML.glob("*.html")) + sorted(HTML.glob("chapters/*.html"))
PAGES = [p for p in PAGES if p.name not in ("genindex.html", "search.html")]

missing = (["no built book"] if not PAGES else []) + headless.MISSING
if missing and os.environ.get("REQUIRE_BROWSER_TESTS"):
    pytest.fail(f"browser tests required but: {', '.join(missing)}", pytrace=False)
pytestmark = pytest.mark.skipif(bool(missing), reason=", ".join(missing) or "ready")


SCREENSHOTS = ROOT / "_build" / "screenshots"  # kept as build artefacts


SKIPPED = ("script", "style", "pre", "code", "mjx-container", "mjx-assistive-mml")


class _Text(html.parser.HTMLParser):
    """Visible prose: no scripts, styles, code blocks or MathJax's own markup."""

    def __init__(self):
        super().__init__()
        self.skip, self.parts, self.links = 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag in SKIPPED:
            self.skip += 1
        if tag == "a":
            self.links += [v for k, v in attrs if k == "href" and v]

    def handle_endtag(self, tag):
        if tag in SKIPPED:
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


# Measures, once the page has loaded and its equations are typeset, what a reader would have
# to scroll sideways to see or could not read: the content column's width, and every table,
# figure, code block and displayed equation that is wider than it (figures: drawn wider than
# they are shown).
PROBE = """() => {
  const article = document.querySelector("article.bd-article");
  const style = getComputedStyle(article);
  const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
  const width = article.clientWidth - padding;
  const found = [];
  const name = (el) => (el.closest("[id]") || {}).id || "";
  for (const el of article.querySelectorAll("table, mjx-container[display=true]")) {
    const w = el.getBoundingClientRect().width;
    const tag = el.tagName.toLowerCase();
    if (w > width + 1) found.push(`${tag} ${Math.round(w)} px in #${name(el)}`);
  }
  for (const el of article.querySelectorAll("pre")) {
    const longest = el.textContent.split("\\n").sort((a, b) => b.length - a.length)[0];
    if (el.scrollWidth > el.clientWidth + 1)
      found.push(`code ${el.scrollWidth} px: ${longest.slice(0, 60)}`);
  }
  for (const el of article.querySelectorAll("img")) {
    if (el.naturalWidth > 1.15 * el.clientWidth)
      found.push(`figure ${el.naturalWidth} px at ${el.clientWidth}: ${el.getAttribute("src")}`);
  }
  const page = document.documentElement.scrollWidth - window.innerWidth;
  return {width: Math.round(width), found, page};
}"""


@pytest.fixture(scope="module")
def browser():
    """page -> what a reader's browser shows of it, each page opened once (in a 1280 x 1800
    window): its DOM, every request it made, a screenshot, and the layout probe, then the
    probe again with the window narrowed to a 412 px phone screen."""
    with headless.browser() as chromium:

        @functools.cache
        def look(page):
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            name = page.relative_to(HTML).as_posix().replace("/", "_")[:-5]
            shot = SCREENSHOTS / f"{name}.png"
            with headless.tab(chromium, page.as_uri(), 1280, 1800) as (tab, seen):
                dom = tab.content()
                tab.screenshot(path=shot)
                laptop = tab.evaluate(PROBE)
                tab.set_viewport_size({"width": 412, "height": 1000})
                phone = tab.evaluate(PROBE)
                requests = list(seen.requests)
            return types.SimpleNamespace(
                dom=dom, requests=requests, screenshot=shot, laptop=laptop, phone=phone
            )

        yield look


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(HTML)))
def test_page_renders_offline(page, browser):
    seen = browser(page)
    parser = _Text()
    parser.feed(seen.dom)
    text = "".join(parser.parts)

    if 'class="math' in page.read_text():  # the page has equations: MathJax must typeset them
        assert "<mjx-container" in seen.dom, "MathJax did not run (is it bundled?)"
    for raw in ("$$", "\\begin{", "\\frac", "\\(", "\\["):
        assert raw not in text, f"untypeset TeX {raw!r} visible on the page"
    assert "Traceback (most recent call last)" not in text
    elsewhere = [url for url in seen.requests if not url.startswith(("file:", "data:", "blob:"))]
    assert not elsewhere, f"the page asked for files from elsewhere: {elsewhere}"

    for href in parser.links:
        target = urllib.parse.urlparse(href)
        if target.scheme or target.netloc or not target.path:
            continue  # external links and same-page anchors
        assert (page.parent / urllib.parse.unquote(target.path)).resolve().is_file(), href
    assert seen.screenshot.stat().st_size > 20_000  # a rendered page, not a blank one


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(HTML)))
def test_tables_figures_and_code_fit_the_column(page, browser):
    laptop, phone = browser(page).laptop, browser(page).phone
    assert laptop["width"] >= 700, f"the content column is only {laptop['width']} px wide"
    assert not laptop["found"], "wider than the column at 1280 px:\n" + "\n".join(laptop["found"])
    assert phone["page"] <= 0, f"the page scrolls sideways by {phone['page']} px on a phone"


def test_every_chapter_has_a_page():
    built = {p.stem for p in HTML.glob("chapters/*.html")}
    sources = {p.stem for p in (ROOT / "chapters").glob("*.ipynb")}
    sources |= {p.stem for p in (ROOT / "chapters").glob("*.md")}
    assert sources <= built, f"not built: {sorted(sources - built)}"
    figures = [
        m
        for p in HTML.glob("chapters/*.html")
        for m in re.findall(r'<img[^>]+src="([^"]+\.png)"', p.read_text())
    ]
    assert figures and all((HTML / "chapters" / f).resolve().is_file() for f in figures)
