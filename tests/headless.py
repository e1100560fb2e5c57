"""Headless Chromium for the browser tests: Debian's chromium with the browser's own services
(clock, sign-in, autofill, updates) kept quiet, so that a page's requests are its own."""

import shutil
import subprocess

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
QUIET = [
    "--headless",
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


def run(target, profile, *flags, budget_ms=10_000, timeout=120):
    """Open `target` (a URL) with a fresh profile; virtual time runs only while the page
    idles, so budget_ms bounds waiting, not computing. -> the finished process."""
    command = [
        CHROMIUM,
        *QUIET,
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        *flags,
        target,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)
