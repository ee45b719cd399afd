"""Screenshots of a vocablens report, one PNG per section, in headless Chromium (Debian's package).

    python docs/screenshots.py REPORT.html OUT_DIR [--prefix NAME]

Needs playwright (pip) and chromium (apt-get install -y --no-install-recommends chromium).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("out_dir")
    ap.add_argument("--prefix", default="report")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(Path(args.report).resolve().as_uri())
        page.wait_for_function("() => document.querySelectorAll('.figure .main-svg').length > 0")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / f"{args.prefix}-top.png"))
        for sec in page.query_selector_all("main > section"):
            sec.scroll_into_view_if_needed()
            page.wait_for_timeout(300)
            sid = sec.get_attribute("id")
            sec.screenshot(path=str(out / f"{args.prefix}-{sid}.png"))
            print(out / f"{args.prefix}-{sid}.png")
        browser.close()


if __name__ == "__main__":
    main()
