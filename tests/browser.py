"""Headless Chromium for the tests of what a person looks at (the report, the dashboard).

It drives Debian's ``chromium`` through Debian's ``chromedriver`` with Selenium. A missing
browser fails the test (``make test`` installs it); it never skips.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = "chromium"
DRIVER = "chromedriver"


@contextmanager
def chromium(width: int = 1280, height: int = 2000) -> Iterator[Any]:
    """A headless Chromium WebDriver whose browser console log can be read."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which(CHROMIUM), shutil.which(DRIVER)
    if binary is None or driver is None:
        pytest.fail(f"{CHROMIUM} and {DRIVER} are needed (Debian: apt-get install chromium chromium-driver; "
                    "`make test` installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=opts, service=Service(driver))
    try:
        yield browser
    finally:
        browser.quit()


def console_errors(browser: Any) -> list[str]:
    """The browser console's errors and warnings since the last call."""
    return [f"{e['level']}: {e['message']}" for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
