"""The built book as a reader's browser shows it: every page of _build/html opened in
headless Chromium, offline. Equations must be typeset by the bundled MathJax (no raw TeX
left), no page may show a traceback, and every internal link must lead to a file.

Needs the built book (`jupyter-book build .`) and Debian's chromium; .ci/run provides both
and sets REQUIRE_BROWSER_TESTS=1 so that, in CI, their absence is a failure, not a skip."""

import html.parser
import json
import os
import pathlib
import re
import urllib.parse

import pytest

import headless

ROOT = pathlib.Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
CHROMIUM = headless.CHROMIUM
PAGES = sorted(HTML.glob("*.html")) + sorted(HTML.glob("chapters/*.html"))
PAGES = [p for p in PAGES if p.name not in ("genindex.html", "search.html")]

missing = [
    why for why, absent in (("no built book", not PAGES), ("no chromium", not CHROMIUM)) if absent
]
if missing and os.environ.get("REQUIRE_BROWSER_TESTS"):
    pytest.fail(f"browser tests required but: {', '.join(missing)}", pytrace=False)
pytestmark = pytest.mark.skipif(bool(missing), reason=", ".join(missing) or "ready")


SCREENSHOTS = ROOT / "_build" / "screenshots"  # kept as build artefacts


def chromium(page, profile, *output):
    return headless.run(page.as_uri(), profile, *output).stdout


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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(HTML)))
def test_page_renders_offline(page, tmp_path):
    dom = chromium(page, tmp_path / "profile", "--dump-dom")
    source = page.read_text()
    parser = _Text()
    parser.feed(dom)
    text = "".join(parser.parts)

    if 'class="math' in source:  # the page has equations: MathJax must have typeset them
        assert "<mjx-container" in dom, "MathJax did not run (is it bundled?)"
    for raw in ("$$", "\\begin{", "\\frac", "\\(", "\\["):
        assert raw not in text, f"untypeset TeX {raw!r} visible on the page"
    assert "Traceback (most recent call last)" not in text

    for href in parser.links:
        target = urllib.parse.urlparse(href)
        if target.scheme or target.netloc or not target.path:
            continue  # external links and same-page anchors
        assert (page.parent / urllib.parse.unquote(target.path)).resolve().is_file(), href

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"{page.relative_to(HTML).as_posix().replace('/', '_')[:-5]}.png"
    chromium(page, tmp_path / "profile-2", "--window-size=1300,1800", f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


# Measures, once the page has loaded, what a reader would have to scroll sideways to see or
# could not read: the content column's width, and every table, figure, code block and
# displayed equation that is wider than it (figures: drawn wider than they are shown).
PROBE = """<script>
window.addEventListener("load", () => setTimeout(() => {
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
  const probe = document.createElement("pre");
  probe.id = "layout-probe";
  probe.textContent = JSON.stringify({width: Math.round(width), found, page});
  document.body.appendChild(probe);
}, 500));
</script>"""


def layout(page, profile, width):
    """The probe's findings for `page` in a window `width` px wide."""
    probed = page.with_name(f"probe-{page.name}")  # beside the page, so its links resolve
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    try:
        dom = chromium(probed, profile, f"--window-size={width},1000", "--dump-dom")
    finally:
        probed.unlink()
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
    assert found, "the layout probe did not run"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(HTML)))
def test_tables_figures_and_code_fit_the_column(page, tmp_path):
    laptop = layout(page, tmp_path / "laptop", 1280)
    assert laptop["width"] >= 700, f"the content column is only {laptop['width']} px wide"
    assert not laptop["found"], "wider than the column at 1280 px:\n" + "\n".join(laptop["found"])
    phone = layout(page, tmp_path / "phone", 412)
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
