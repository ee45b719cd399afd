"""The main job: `vocablens report` writes a self-contained HTML page that draws in a real browser."""

import io
import json
import os
import stat
import shutil

import numpy as np
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    return tmp_path_factory.mktemp("report") / "report.html"


def test_report_writes_html(cli, report_file):
    code, out, err = cli("report", "--out", report_file, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["out"] == str(report_file) and report_file.is_file()
    assert d["model"]["tensor_types"]["embedding"] == "Q8_0"
    assert d["tie_check"]["tied"] and d["tie_check"]["max_abs_diff"] == 0.0
    assert d["lens"]["layers"][-1]["positions"][-1]["top_tokens"][0] == " Paris"
    # the rename keeps the usual permissions (mkstemp's 0600 would make the page unreadable to others)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(report_file.stat().st_mode) == 0o666 & ~umask
    html = report_file.read_text()
    assert "<script src=" not in html and "<link " not in html  # plotly.js inlined, nothing external
    for sid in d["sections"]:
        assert f'id="{sid}"' in html
    assert "Q4_1 GGUF" in html and "Q8_0" in html


def test_report_keeps_existing_file_on_error(cli, tmp_path):
    target = tmp_path / "keep.html"
    target.write_text("precious")
    code, out, err = cli("report", "--out", target, "--prompt", "")
    assert code == 2 and target.read_text() == "precious"


@pytest.mark.browser
def test_report_renders_in_headless_chromium(cli, report_file):
    from matplotlib.image import imread
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "Debian's chromium is needed for this test: apt-get install -y chromium"

    if not report_file.exists():
        code, _, err = cli("report", "--out", report_file)
        assert code == 0, err
    problems, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))

        def route(r):
            if not r.request.url.startswith(("file:", "data:", "blob:")):
                requests.append(r.request.url)
                return r.abort()
            return r.continue_()

        page.route("**/*", route)
        page.goto(report_file.as_uri())
        page.wait_for_function("() => document.querySelectorAll('.figure .main-svg').length > 0")
        page.wait_for_timeout(500)
        figures = page.query_selector_all("div.figure")
        assert figures, "no figure in the report"
        for fig in figures:
            fig.scroll_into_view_if_needed()
            box = fig.bounding_box()
            assert box and box["width"] > 300 and box["height"] > 150, fig.get_attribute("data-figure")
            img = imread(io.BytesIO(fig.screenshot()))[..., :3]
            colours = np.unique((img.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
            # a drawn plot has many colours; a blank area has one or two
            assert len(colours) > 50 and img.std() > 0.05, fig.get_attribute("data-figure")
            assert fig.query_selector(".main-svg") is not None
        browser.close()
    assert problems == [], problems
    assert requests == [], requests
