"""The review page in headless Chromium (selenium, chromium-driver; skips when absent): it all works."""

from __future__ import annotations

import os
import re
import shutil

import pandas as pd
import pytest

from harness.cli.main import main
from tests.tiny_cases import write_cases

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="no headless browser: apt-get install -y chromium chromium-driver (found "
    f"chromium={CHROMIUM}, chromedriver={DRIVER})",
)

CASE = {"name": "small_decode", "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 32, "block_size": 4,
        "seq_lens": [3, 9, 17], "tags": ["small"], "sweep": {"dtype": ["float32", "bfloat16"]}}  # fmt: skip
PLUGIN = """
from harness import register_backend

def exploding(*args, **kwargs):
    raise RuntimeError("<script>window.__pwned = 1</script> boom")

register_backend("exploding<b>", exploding)
"""


@pytest.fixture
def run_dir(tmp_path, plot_text_as_text, clean_registry):
    write_cases(tmp_path / "cases.toml", CASE, defaults={})
    out, plugin = tmp_path / "run", tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    argv = ["run", str(tmp_path / "cases.toml"), "--out", str(out), "--no-progress", "--plugin", str(plugin)]
    for name in ("reference", "tlsim", "gather_sdpa", "flex_attention", "exploding<b>"):
        argv += ["--backend", name]
    assert main(argv) == 1  # the exploding backend errors
    return out


@pytest.fixture
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    flags = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000")
    for flag in flags:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def _texts(driver, selector: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, selector) if e.is_displayed()]


@pytest.mark.slow  # a browser and a harness run
def test_the_review_page_works_in_a_browser(drawn_plots, run_dir, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    frame = pd.read_parquet(run_dir / "results.parquet")
    browser.get((run_dir / "report.html").as_uri())

    verdict = browser.find_element(By.ID, "verdict").text
    assert verdict.startswith("FAIL") and "exploding<b>" in verdict, verdict
    assert "<script>window.__pwned = 1</script> boom" in verdict, verdict
    assert browser.execute_script("return window.__pwned === undefined"), "a plugin's string ran as script"

    graded = frame[frame["status"] != "skip"]
    cases = _texts(browser, "#rows tbody td.case")
    assert sorted(cases) == sorted(graded["case"]), "every graded row is in the table"
    assert len(_texts(browser, "#pivot tbody tr")) == frame["case"].nunique()

    header = browser.find_element(By.XPATH, "//table[@id='rows']//th[normalize-space()='latency µs']")
    column = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#rows thead th")].index("latency µs")

    def latencies():
        cells = browser.find_elements(By.CSS_SELECTOR, f"#rows tbody tr td:nth-child({column + 1})")
        return [float(c.get_attribute("data-v")) for c in cells if c.get_attribute("data-v")]

    header.click()
    assert latencies() == sorted(latencies()) and len(latencies()) == graded["latency_us"].notna().sum()
    header.click()
    assert latencies() == sorted(latencies(), reverse=True)

    search = browser.find_element(By.CSS_SELECTOR, "input[data-filter='rows']")
    search.send_keys("tlsim bfloat16")
    assert _texts(browser, "#rows tbody td.case") == ["small_decode/dtype=bfloat16"]
    assert browser.find_element(By.ID, "rows-shown").text == "1"
    search.clear()
    search.send_keys(" ")

    Select(browser.find_element(By.ID, "speedup-ref")).select_by_value("reference")
    speedups = _texts(browser, "#pivot .speedup")
    assert len(speedups) == 2 * 3 and all(s.endswith("× vs reference") for s in speedups)
    assert "1.00× vs reference" in speedups

    images = browser.find_elements(By.CSS_SELECTOR, "figure img")
    assert len(images) >= 2
    assert all(i.get_attribute("src").startswith("data:image/svg+xml") for i in images)
    assert all(
        browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", i) for i in images
    )

    skipped = browser.find_element(By.ID, "skipped")
    assert skipped.get_attribute("open") is None and "flex_attention" not in " ".join(cases)

    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors

    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(height + 100, 8000))
    shot = tmp_path / "report.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
    if os.environ.get("HARNESS_SCREENSHOT_DIR"):
        shutil.copy(shot, os.environ["HARNESS_SCREENSHOT_DIR"])

    # Each plot opened as the browser draws it (its text kept as text: plot_text_as_text): the log
    # axes' tick labels read as numbers ("10" with its exponent), never as TeX source.
    for src in [i.get_attribute("src") for i in images]:
        browser.get(src)
        drawn = ["".join(t.text.split()) for t in browser.find_elements(By.TAG_NAME, "text")]
        assert drawn and not [t for t in drawn if "$" in t or "mathdefault" in t], drawn
        assert any(re.fullmatch(r"10[−-]?[0-9]+", t) for t in drawn), drawn


def test_the_compare_page_gives_its_why_column_room_and_every_judged_row_its_adjusted_p(browser, tmp_path):
    """A drifted pair of runs whose doubtful rows paired rounds re-timed: one backend confirmed slower."""
    import numpy as np
    from selenium.webdriver.common.by import By

    from harness.review.compare import CompareOptions, compare_runs, write_compare_html
    from harness.review.confirm import rejudge
    from tests.harness import review_frames as rf

    drifted = {b: 1.5 for b in rf.BACKENDS}
    runs = [rf.frame(3, seed=0), rf.frame(3, seed=1, slow=drifted)]
    for frame in runs:  # case ids as a sweep writes them
        frame["case"] = frame["case"].str.replace("case", "long_half_accumulation/dtype=bfloat16/block_size=")
    comparison = compare_runs(*runs, rf.meta(), rf.meta())
    rng = np.random.default_rng(0)
    index = dict(zip(comparison.rows.index, zip(comparison.rows["case"], comparison.rows["backend"], strict=True),
                     strict=True))  # fmt: skip
    pooled = {}
    for case, backend in index.values():
        load = np.exp(rng.normal(0, 0.3, 12))
        truly = 1.3 if backend == "tlsim" else 1.0
        pooled[(case, backend)] = (list(100 * load), list(100 * truly * load * np.exp(rng.normal(0, 0.02, 12))))
    page = write_compare_html(rejudge(comparison, index, pooled, CompareOptions()), tmp_path / "compare.html",
                              ("base", rf.meta()), ("new", rf.meta()))  # fmt: skip
    browser.get(page.as_uri())

    verdict = browser.find_element(By.ID, "verdict").text
    assert "exit 1: 3 row(s) got worse" in verdict and "the 3 confirmed slower are a change of the code" in verdict
    header = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#cmp thead th")]
    rows = browser.find_elements(By.CSS_SELECTOR, "#cmp tbody tr")
    p_cells = [r.find_elements(By.TAG_NAME, "td")[header.index("adj. p")].text for r in rows]
    assert len(p_cells) == 9 and all(p_cells), p_cells
    root_px = browser.execute_script("return parseFloat(getComputedStyle(document.documentElement).fontSize)")
    widths = [r.find_elements(By.TAG_NAME, "td")[header.index("why")].size["width"] for r in rows]
    assert len(widths) == 9 and min(widths) >= 20 * root_px, f"the why column is squeezed: {widths} px"
