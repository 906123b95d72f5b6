"""`registry serve` in a real browser: headless Chromium (the Debian package)
driven by Selenium through the distribution's chromedriver, against a server
process on a free port. Skipped when Chromium is absent, unless
REGISTRY_REQUIRE_BROWSER=1 (CI), where that is a failure."""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import run_cli
from tests.web_util import EVIL, build, serve

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--window-size=1280,1400")


def _missing() -> str | None:
    if not CHROMIUM or not CHROMEDRIVER:
        return "chromium and chromium-driver (Debian packages) are not installed"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed"
    return None


def _chrome(*flags: str) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a browser
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in (*CHROMIUM_FLAGS, *flags):
        opts.add_argument(flag)
    d = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(60)
    return d


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    why = _missing()
    if why:
        if os.environ.get("REGISTRY_REQUIRE_BROWSER") == "1":
            pytest.fail(f"REGISTRY_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    d = _chrome()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(base URL, store, db) of a live `registry serve` over a fresh registry."""
    root = tmp_path_factory.mktemp("browser")
    store, db = str(root / "store"), f"sqlite:///{root / 'index.db'}"
    build(store, db)
    with serve(store, db) as base:
        yield base, store, db


def visit(driver: Any, base: str, path: str, shots: Path | None = None,
          name: str = "") -> str:
    from selenium.webdriver.common.by import By

    driver.get(base + path)
    body = driver.find_element(By.TAG_NAME, "body")
    assert "model-registry" in driver.title, (path, driver.title)
    if shots is not None:
        shots.mkdir(exist_ok=True)
        driver.save_screenshot(str(shots / f"{name}.png"))
        assert (shots / f"{name}.png").stat().st_size > 10_000
    text: str = body.text
    return text


def visible(driver: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    found = [e for e in driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]
    assert found, f"nothing visible matches {css}"
    return found


def test_every_page_renders_with_gate_reasons_and_charts(
        driver: Any, site: tuple[str, str, str], tmp_path: Path) -> None:
    base = site[0]
    shots = tmp_path / "screenshots"
    text = visit(driver, base, "/", shots, "models")
    assert "tiny 3 3 3 prod" in text

    text = visit(driver, base, "/models/tiny", shots, "model")
    failing = [e for e in visible(driver, "#versions td.reason") if e.text]
    assert len(failing) == 1  # only version 1 fails
    reason = failing[0]
    assert reason.text.startswith("ledger: source books is revoked in the live ledger")
    assert "policy:copy/accuracy>=0.92: copy/accuracy=0.9, required >= 0.92" in reason.text
    charts = visible(driver, "#charts svg.chart")
    assert len(charts) == 2
    for svg in charts:
        assert svg.size["width"] > 300 and svg.size["height"] > 100
        assert len(svg.find_elements("css selector", "polyline")) >= 2  # values + threshold
        assert len(svg.find_elements("css selector", "circle")) == 3  # one per version

    text = visit(driver, base, "/models/tiny/1", shots, "version")
    assert "ledger FAIL source books is revoked in the live ledger" in text
    card = visible(driver, "#card")[0]
    assert EVIL.replace('"', "") in card.text.replace('"', "")  # markup shown as text
    assert driver.execute_script("return window.__pwned === undefined")
    assert not driver.find_elements("css selector", "#card script, #card img")
    assert "registry pull tiny@1 --store" in visible(driver, "#pull")[0].text
    assert "REVOKED: the publisher withdrew the licence" in visible(
        driver, "#ledger tr.revoked")[0].text

    text = visit(driver, base, "/models/tiny/prod", shots, "alias")
    assert "tiny@2 PASS" in text and "heads/sentiment.json" in text

    text = visit(driver, base, "/sources/books", shots, "source")
    assert "Data source books REVOKED" in text and "tiny@1" in text

    text = visit(driver, base, "/runs/r1", shots, "run")
    assert "LATEST → step 30" in text
    chart = visible(driver, "#charts svg.chart")[0]
    assert len(chart.find_elements("css selector", "circle")) == 3

    text = visit(driver, base, "/models/tiny/9.9", shots, "not-found")
    assert "404" in text and "9.9" in text
    assert {p.name for p in shots.iterdir()} == {f"{n}.png" for n in (
        "models", "model", "version", "alias", "source", "run", "not-found")}


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_link_checker_walks_every_link_from_the_index(driver: Any,
                                                      site: tuple[str, str, str]) -> None:
    base = site[0]
    host = urlsplit(base).netloc
    seen: set[str] = set()
    todo = [base + "/"]
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        assert status_of(url) == 200, url
        if urlsplit(url).path.startswith("/api/") and not url.endswith("/docs"):
            continue  # JSON
        driver.get(url)
        for href in driver.execute_script("return Array.from(document.links, a => a.href)"):
            href = href.split("#")[0]
            if urlsplit(href).netloc == host:
                todo.append(href)
    paths = {urlsplit(u).path for u in seen}
    assert {"/", "/models/tiny", "/models/tiny/1", "/models/tiny/2", "/models/tiny/3",
            "/models/tiny/prod", "/sources/wiki", "/sources/books", "/sources/news",
            "/runs/r1", "/api/v1/docs", "/api/v1/models"} <= paths, paths


def test_a_revocation_done_with_the_cli_shows_on_reload(driver: Any,
                                                        site: tuple[str, str, str]) -> None:
    base, store, db = site
    text = visit(driver, base, "/models/tiny/3")
    assert "tiny@3 PASS" in text and "news news corpus CC-BY-4.0 train, eval live" in text
    r = run_cli("ledger", "revoke", "news", "--reason", "scraped without consent",
                "--store", store, "--db", db)
    assert r.returncode == 0, r.stderr
    driver.refresh()
    text = driver.find_element("tag name", "body").text
    assert "tiny@3 FAIL" in text
    assert "ledger FAIL source news is revoked in the live ledger (scraped without consent)" \
        in text
    assert "REVOKED: scraped without consent" in visible(driver, "#ledger tr.revoked")[0].text
    text = visit(driver, base, "/")
    assert "tiny 3 3 2 prod" in text  # the newest passing version is now 2
    text = visit(driver, base, "/sources/news")
    assert "Data source news REVOKED" in text and "scraped without consent" in text


# -- a web page in the operator's browser is the attacker (issue 30, item 3) ----------------


def test_the_csp_blocks_injected_script_and_the_stylesheet_applies(
        driver: Any, site: tuple[str, str, str]) -> None:
    base = site[0]
    visit(driver, base, "/models/tiny/1")
    header = driver.find_element("tag name", "header")
    assert header.value_of_css_property("background-color") == "rgba(27, 31, 36, 1)"
    # markup that reached the DOM (as a stored XSS would) cannot run inline script
    driver.execute_script("""
        const s = document.createElement('script');
        s.textContent = 'window.__injected = 1';
        document.body.appendChild(s);
        const i = document.createElement('img');
        i.setAttribute('src', 'x'); i.setAttribute('onerror', 'window.__onerror = 1');
        document.body.appendChild(i);""")
    assert driver.execute_script("return [window.__injected, window.__onerror]") == [None, None]
    visit(driver, base, "/api/v1/docs")
    assert "/api/v1/models/{model_id}/releases" in driver.find_element("tag name", "body").text
    assert driver.execute_script("return document.scripts.length") == 0


def test_the_server_cannot_be_framed(driver: Any, site: tuple[str, str, str],
                                     tmp_path: Path) -> None:
    base = site[0]
    page = tmp_path / "framer.html"
    page.write_text(f'<iframe id="f" src="{base}/models/tiny" width="800" height="600">'
                    "</iframe>")
    driver.get(page.as_uri())
    import time

    time.sleep(1)
    frame = driver.find_element("id", "f")
    driver.switch_to.frame(frame)
    try:
        text = driver.find_element("tag name", "body").text
    finally:
        driver.switch_to.default_content()
    assert "tiny" not in text  # frame-ancestors 'none': Chromium shows its own error page


def test_dns_rebinding_is_refused_in_a_real_browser(site: tuple[str, str, str]) -> None:
    """evil.example resolves to the server's loopback address (as after a DNS
    rebinding): the browser sends ``Host: evil.example:PORT`` and gets 421,
    not the registry; the server's own name still works."""
    if _missing():
        pytest.skip(str(_missing()))
    base = site[0]
    port = urlsplit(base).port
    d = _chrome("--host-resolver-rules=MAP evil.example 127.0.0.1")
    try:
        d.get(f"http://evil.example:{port}/models/tiny")
        body = d.find_element("tag name", "body").text
        assert "421" in body and "MisdirectedRequest" in body, body
        assert "Versions" not in body and "prod" not in body
        d.get(f"http://evil.example:{port}/api/v1/models")
        body = d.find_element("tag name", "body").text
        assert "MisdirectedRequest" in body and '"tiny"' not in body, body
        d.get(f"http://localhost:{port}/models/tiny")
        assert "421" not in d.find_element("tag name", "body").text
        assert "tiny" in d.title
    finally:
        d.quit()
