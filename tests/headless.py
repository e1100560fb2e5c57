"""Headless Chromium for the browser tests: Debian's chromium, driven by Playwright (its own
browser download is never used), with the browser's own services (clock, sign-in, autofill,
updates) kept quiet, so that a page's requests are its own. One browser serves a whole test
module; each page opens in a fresh context (no cookies, cache or storage from another page)."""

import contextlib
import shutil
import types

try:
    from playwright.sync_api import TimeoutError as PageTimeout
    from playwright.sync_api import sync_playwright
except ImportError:  # the tests that need it say so and skip (or, in CI, fail)
    PageTimeout, sync_playwright = None, None

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MISSING = [
    why
    for why, absent in (
        ("no chromium", not CHROMIUM),
        ("no playwright (pip install -r requirements.txt)", sync_playwright is None),
    )
    if absent
]
QUIET = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-client-side-phishing-detection",
    "--disable-features=AutofillServerCommunication,NetworkTimeServiceQuerying,"
    "OptimizationHints,MediaRouter,Translate,SigninInterceptBubble",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
]
# MathJax typesets after the load event; this resolves once it has (or at once without it)
TYPESET = "() => window.MathJax?.startup?.promise ?? null"


@contextlib.contextmanager
def browser(*flags):
    """One headless Chromium for a test module."""
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=[*QUIET, *flags])
        try:
            yield chromium
        finally:
            chromium.close()


@contextlib.contextmanager
def tab(chromium, url, width, height=1000):
    """`url` loaded in a fresh context `width` x `height` px, its equations typeset.
    -> (page, seen): the page, and what it has done so far: seen.requests, the URL of every
    request it made; seen.console, every message it wrote to the console."""
    context = chromium.new_context(viewport={"width": width, "height": height})
    seen = types.SimpleNamespace(requests=[], console=[])
    try:
        page = context.new_page()
        page.on("request", lambda request: seen.requests.append(request.url))
        page.on("console", lambda message: seen.console.append(message.text))
        page.goto(url, wait_until="load")
        page.wait_for_function(
            "() => !document.querySelector('script[src*=mathjax i]')"
            " || window.MathJax?.startup?.promise"
        )
        page.evaluate(TYPESET)
        yield page, seen
    finally:
        context.close()
