"""Screenshots of a vocablens report, one PNG per section, in headless Chromium (Debian's package).

    python docs/screenshots.py REPORT.html OUT_DIR [--prefix NAME]

Needs playwright (pip) and chromium (apt-get install -y --no-install-recommends chromium). Prints each
PNG's path on stdout; progress (the step, sections done of all) goes to stderr: rich bars on a terminal,
plain lines otherwise (``vocablens.cli.progress``).
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
    from vocablens.cli.progress import stage_progress

    cb, close = stage_progress("screenshots", "steps")
    try:
        with sync_playwright() as p:
            cb("start chromium, draw the figures", 0, 3)
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            cb("start chromium, draw the figures", 1, 3)
            page.goto(Path(args.report).resolve().as_uri())
            cb("start chromium, draw the figures", 2, 3)
            page.wait_for_function("() => document.querySelectorAll('.figure .main-svg').length > 0")
            page.wait_for_timeout(1500)
            cb("start chromium, draw the figures", 3, 3)
            page.screenshot(path=str(out / f"{args.prefix}-top.png"))
            sections = page.query_selector_all("main > section")
            for i, sec in enumerate(sections):
                sec.scroll_into_view_if_needed()
                page.wait_for_timeout(300)
                sid = sec.get_attribute("id")
                sec.screenshot(path=str(out / f"{args.prefix}-{sid}.png"))
                print(out / f"{args.prefix}-{sid}.png", flush=True)
                cb("section screenshots", i + 1, len(sections))
            browser.close()
    finally:
        close()

if __name__ == "__main__":
    main()
