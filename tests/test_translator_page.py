"""The "Try the translator" page in a real browser: the built book served on 127.0.0.1,
the page opened in headless Chromium with ?de=<sentence> for validation sentences. The
translation the page writes must be the module's `translate(..., beam_size=4)`, the attention
grid must be drawn, nothing may be requested from outside 127.0.0.1, and the page must fit the
column at 1280 px and on a 412 px phone. "Nothing from outside" is checked three ways: no host
but 127.0.0.1 resolves; a content security policy of 'self', put first in the page's <head>,
reports every attempt to load from elsewhere; every resource the page loaded or asked for
is on 127.0.0.1.

Needs the built book with the page's files (`npm ci`, `python code/export_onnx.py`, then
`jupyter-book build .`), Debian's chromium and Playwright; .ci/run provides them and sets
REQUIRE_BROWSER_TESTS=1, so that there their absence fails instead of skipping."""

import functools
import http.server
import json
import os
import threading
import urllib.parse

import pytest

import annotated_transformer as at
import export_onnx
import headless
import script_helpers as helpers

HTML = export_onnx.ROOT / "_build" / "html"
PAGE = HTML / "chapters" / "try_translator.html"
ENGINE = HTML / "_static" / "translator" / "vendor" / "ort.wasm.min.mjs"
missing = [
    why
    for why, absent in (
        ("no built page", not PAGE.is_file()),
        (
            "the page's engine was not exported (npm ci; python code/export_onnx.py)",
            not ENGINE.is_file(),
        ),
    )
    if absent
] + headless.MISSING
if missing and os.environ.get("REQUIRE_BROWSER_TESTS"):
    pytest.fail(f"translator page test required but: {', '.join(missing)}", pytrace=False)
pytestmark = pytest.mark.skipif(bool(missing), reason=", ".join(missing) or "ready")

# First in <head>: loads from anywhere but this server are refused, and each attempt recorded.
GUARD = """<meta http-equiv="Content-Security-Policy"
  content="default-src 'self' 'unsafe-inline' 'unsafe-eval' 'wasm-unsafe-eval' blob: data:">
<script>
window.blockedLoads = [];
document.addEventListener("securitypolicyviolation", (e) => window.blockedLoads.push(e.blockedURI));
</script>"""
# Once the page shows a translation or an error, reports what a reader sees.
PROBE = """<script>
function report() {
  const column = document.querySelector(".bd-article").getBoundingClientRect().width;
  const wide = [...document.querySelectorAll(".translator, .translator *")]
    .filter((e) => e.getBoundingClientRect().width > column + 1)
    .map((e) => e.tagName + "." + e.className);
  const cells = document.querySelectorAll("#attention svg rect");
  const probe = document.createElement("pre");
  probe.id = "translator-probe";
  probe.textContent = JSON.stringify({
    translation: document.getElementById("translation").textContent,
    status: document.getElementById("status").textContent,
    cells: cells.length,
    rows: new Set([...cells].map((r) => r.getAttribute("y"))).size,
    column, wide, sideways: document.documentElement.scrollWidth - window.innerWidth,
    resources: performance.getEntriesByType("resource").map((r) => r.name),
    blocked: window.blockedLoads,
  });
  document.body.appendChild(probe);
}
// report once the page has drawn a translation's attention, or shown an error
new MutationObserver((changes, observer) => {
  if (document.querySelector("#attention svg, #status.translator-error")) {
    observer.disconnect();
    report();
  }
}).observe(document.querySelector(".translator"), {subtree: true, childList: true});
</script>"""


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    book = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(HTML))
    )
    threading.Thread(target=book.serve_forever, daemon=True).start()
    probed = PAGE.with_name("probe-try_translator.html")
    text = PAGE.read_text().replace("<head>", "<head>" + GUARD, 1)
    probed.write_text(text.replace("</body>", PROBE + "</body>"))
    yield book.server_address[1]
    probed.unlink()
    book.shutdown()


@pytest.fixture(scope="module")
def chromium():
    # no host but 127.0.0.1 resolves, so nothing can come from elsewhere
    with headless.browser("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1") as browser:
        yield browser


def open_page(chromium, port, sentence, width):
    """What the page reports once it has translated `sentence` in a window `width` px wide,
    and every request it made."""
    query = urllib.parse.urlencode({"de": sentence})
    url = f"http://127.0.0.1:{port}/chapters/probe-try_translator.html?{query}"
    with headless.tab(chromium, url, width) as (page, seen):
        try:
            probe = page.wait_for_selector("#translator-probe", state="attached", timeout=180_000)
        except headless.PageTimeout:
            pytest.fail(f"the page never reported; its console: {seen.console}")
        return json.loads(probe.text_content()), list(seen.requests)


@pytest.fixture(scope="module")
def sentences():
    """Three validation sentences and their translations by the module (beam 4, at the α
    val chose for the shipped weights, which the export records)."""
    pairs = helpers.load_multi30k("val")
    chosen = [pairs[i][0] for i in (1, 2, 6)]
    model, tokenizer = at.load_checkpoint(helpers.SHIPPED_TRANSLATOR)
    alpha = json.loads((HTML / "_static" / "translator" / "translator.json").read_text())["alpha"]
    assert alpha == helpers.recorded_alpha(at.read_checkpoint(helpers.SHIPPED_TRANSLATOR)) != 0.6
    return dict(zip(chosen, at.translate(model, tokenizer, chosen, beam_size=4, alpha=alpha)))


def test_the_page_translates_as_the_module_does_and_draws_the_attention(
    chromium, server, sentences
):
    tokenizer = at.Tokenizer.from_file(str(HTML / "_static" / "translator" / "tokenizer.json"))
    for i, (german, english) in enumerate(sentences.items()):
        width = 412 if i == 0 else 1280  # one of them on a phone's screen
        seen, requests = open_page(chromium, server, german, width)
        assert seen["translation"] == english, (german, seen["status"])
        # a column for each source piece and </s>, a row for each generated piece
        columns = len(tokenizer.encode(german).ids) + 1
        assert seen["rows"] > 1 and seen["cells"] == seen["rows"] * columns
        assert not seen["wide"], (
            f"wider than the {seen['column']} px column at {width} px: {seen['wide']}"
        )
        assert seen["sideways"] <= 0, f"the page scrolls sideways at {width} px"
        loaded = seen["resources"] + [r for r in requests if not r.startswith(("data:", "blob:"))]
        outside = [r for r in loaded if not r.startswith("http://127.0.0.1:")]
        assert not outside and not seen["blocked"], (outside, seen["blocked"])
