"""`vaswani-mt demo` in a real browser: the command serves the page, headless Chromium (Debian's chromium and its
chromedriver, driven by Selenium; nothing downloaded) types sentences, and the page shows the translations, the
n-best scores and the attention heatmap that `vaswani_mt.inference.demo` computes for the same model; empty text
and a sentence longer than the model holds get one message in the page. A screenshot is saved.

Run with ``pytest -m browser`` (not part of the default run). Skipped, with the reason, without gradio, selenium or
/usr/bin/chromium (``apt-get install chromium chromium-driver``); with ``VASWANI_MT_REQUIRE_BROWSER=1`` (as CI runs
it) a missing one fails instead, so that the run cannot pass without the browser. ``VASWANI_MT_DEMO_MODEL=FOLDER`` runs it on that
model instead of a tiny random one, and ``VASWANI_MT_DEMO_SCREENSHOT=FILE`` keeps the screenshot there (the
screenshot docs/demo.png, shown in docs/inference.md, was taken so, with the model of the quick Multi30k run).
"""

import os
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT = 120  # seconds, for a translation on a busy 2-core machine
SENTENCES_TYPED = ["A man rides a bike down the street.", "Two dogs play in the snow."]

REQUIRED = os.environ.get("VASWANI_MT_REQUIRE_BROWSER") == "1"


def missing(reason: str) -> None:
    """Skip for want of `reason`, or fail where the browser test is required."""
    if REQUIRED:
        pytest.fail(f"VASWANI_MT_REQUIRE_BROWSER=1, but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    import gradio as gr  # noqa: F401 - the demo needs it
    from selenium import webdriver
except ImportError as error:
    missing(f"the browser test needs gradio and selenium ({error}): pip install -e '.[dev]'")
from demo_server import serving  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from test_demo import stopping_model  # noqa: E402

from vaswani_mt.inference.demo import EMPTY_TEXT, load_demo_model, translate_nbest  # noqa: E402


@pytest.fixture
def model_dir(tokenizer, tmp_path):
    if os.environ.get("VASWANI_MT_DEMO_MODEL"):
        return Path(os.environ["VASWANI_MT_DEMO_MODEL"])
    folder = tmp_path / "model"
    stopping_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium on a machine without a display, as root (--no-sandbox), offline (no background networking,
    component updates, sync or QUIC), with a fresh profile and a fixed window size for the screenshot."""
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        missing(f"the browser test needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
                 f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def value(driver, selector: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, selector).get_attribute("value")


def text_of(driver, selector: str) -> str:
    return driver.find_element(By.CSS_SELECTOR, selector).text


def click_translate_and_wait_for(driver, condition):
    driver.find_element(By.CSS_SELECTOR, "button#translate").click()
    return WebDriverWait(driver, WAIT).until(condition)


def test_the_page_translates_shows_the_nbest_scores_and_the_heatmap_and_reports_bad_input(
        model_dir, browser, tmp_path):
    model, tokenizer = load_demo_model(str(model_dir), "cpu")
    text = "\n".join(SENTENCES_TYPED)
    expected = translate_nbest(model, tokenizer, text)  # the model's own decoding defaults, as the page starts
    screenshot = Path(os.environ.get("VASWANI_MT_DEMO_SCREENSHOT") or tmp_path / "demo.png")
    log = tmp_path / "demo.log"

    with serving(model_dir, log, cwd=Path.cwd()) as (url, process):  # a relative VASWANI_MT_DEMO_MODEL: from here
        browser.get(url)
        source = WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.CSS_SELECTOR, "#source textarea"))
        source.send_keys(text)
        click_translate_and_wait_for(browser, lambda d: value(d, "#translation textarea"))

        assert value(browser, "#translation textarea") == "\n".join(result.translation for result in expected)
        message = text_of(browser, "#message")
        assert message.startswith("2 sentences translated in ") and "hypothes" in message
        table = text_of(browser, "#nbest")
        for hypothesis in expected[0].hypotheses + expected[1].hypotheses[:1]:
            assert f"{hypothesis.log_prob:.3f}" in table and f"{hypothesis.score:.3f}" in table, table
        heatmap = WebDriverWait(browser, WAIT).until(lambda d: d.find_element(By.CSS_SELECTOR, "#heatmap img"))
        WebDriverWait(browser, WAIT).until(lambda d: d.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0", heatmap))
        assert heatmap.get_attribute("src").startswith(url.rstrip("/"))
        assert heatmap.size["width"] > 200 and heatmap.size["height"] > 150
        assert value(browser, "#hypothesis input").startswith(f"line 1, #1 ({expected[0].hypotheses[0].score:.3f})")

        height = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(1280, min(height + 20, 2400))
        browser.save_screenshot(str(screenshot))
        browser.set_window_size(1280, 1000)

        source.send_keys(Keys.CONTROL, "a")  # empty text: one message, the translations cleared
        source.send_keys(Keys.DELETE)
        click_translate_and_wait_for(browser, lambda d: EMPTY_TEXT in text_of(d, "#message"))
        assert value(browser, "#translation textarea") == ""

        limit = model.config.max_position_embeddings  # a sentence longer than the model holds
        source.send_keys(" ".join(["dog"] * (limit + 1)))
        click_translate_and_wait_for(browser, lambda d: "max_position_embeddings" in text_of(d, "#message"))
        assert text_of(browser, "#message").startswith("Line 1 is ")
        assert f"(max_position_embeddings = {limit} tokens)" in text_of(browser, "#message")

    assert process.returncode == 0, log.read_text()  # Ctrl+C stops the command cleanly
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
