"""`vocablens serve` in a real browser (Playwright + Debian's chromium): type a prompt, read the heatmap,
click the last cell, and check that the trajectory and attribution panels show what the API answers.

Set VOCABLENS_SERVE_SCREENSHOT=docs/serve.png to keep the screenshot (the README's picture)."""

from __future__ import annotations

import os
import shutil

import pytest

from test_serve import PROMPT, assert_close, post, start_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def server():
    proc, url = start_server()
    yield url
    proc.kill()
    proc.wait()


@pytest.mark.slow
@pytest.mark.browser
def test_explorer_in_headless_chromium(server, tmp_path):
    if not CHROMIUM:
        pytest.skip("Debian's chromium is not installed: apt-get install -y --no-install-recommends chromium")
    from playwright.sync_api import sync_playwright

    url = server
    problems, outside = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1000, "height": 1500})
        page.set_default_timeout(600_000)
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))

        def route(r):
            if not r.request.url.startswith((url + "/", "data:", "blob:")):
                outside.append(r.request.url)
                return r.abort()
            return r.continue_()

        page.route("**/*", route)
        page.goto(url + "/")
        page.wait_for_function("() => window.vl && window.vl.health")
        page.fill("#prompt", PROMPT)
        page.keyboard.press("Enter")
        page.wait_for_function("() => window.vl.data && document.querySelector('#heatmap .main-svg')")

        # the last layer's top-1 at the last position, as drawn
        L, T, drawn, top = page.evaluate("""() => {
            const d = window.vl.data.logit, gd = document.getElementById('heatmap');
            const L = d.layers.length - 1, T = d.tokens.length;
            return [L, T, gd.data[0].text[L][T - 1], d.layers[L].positions[T - 1].top_tokens[0]]; }""")
        assert top == " Paris" and drawn == "␣Paris" and L == 30 and T == 5

        # keyboard: the arrow keys move the cursor over the cells
        page.focus("#heatmap")
        page.keyboard.press("ArrowLeft")
        assert page.evaluate("() => window.vl.cursor") == {"layer": L, "pos": T - 2}
        page.keyboard.press("ArrowRight")

        # click the cell (layer L, last position) with the mouse
        x, y = page.evaluate("""([L, T]) => {
            const gd = document.getElementById('heatmap'), fl = gd._fullLayout, r = gd.getBoundingClientRect();
            return [r.left + fl.xaxis._offset + fl.xaxis.l2p(T - 1), r.top + fl.yaxis._offset + fl.yaxis.l2p(L)]; }""",
                             [L, T])
        page.mouse.click(x, y)
        page.wait_for_function("() => window.vl.last.trajectory && window.vl.last.explain && "
                               "document.querySelectorAll('#attr-table tr').length > 1 && "
                               "document.querySelector('#traj-plot .main-svg')")
        assert page.evaluate("() => window.vl.cell") == {"layer": L, "pos": T - 1}
        assert "␣Paris" in page.inner_text("#cell-title")
        assert f"cell={L}%2C{T - 1}" in page.url and "prompt=The+capital" in page.url

        # trajectory panel == /api/trajectory
        code, traj = post(url, "/api/trajectory", {"prompt": PROMPT, "position": T - 1, "token": " Paris"})
        assert code == 200
        assert page.evaluate("() => window.vl.last.trajectory") == traj
        rows = page.evaluate("""() => [...document.querySelectorAll('#traj-table tr')].slice(1)
                                  .map(tr => [...tr.cells].map(c => c.textContent))""")
        assert [int(r[1]) for r in rows] == traj["logit"]["rank"]
        assert [int(r[3]) for r in rows] == traj["tuned"]["rank"]
        assert all(abs(float(r[2]) - v) <= 5.1e-5 for r, v in zip(rows, traj["logit"]["prob"]))
        plotted = page.evaluate("() => document.getElementById('traj-plot').data.map(t => [t.name, t.y])")
        assert dict(plotted)["logit: rank"] == [r + 1 for r in traj["logit"]["rank"]]
        assert_close(dict(plotted)["tuned: p"], traj["tuned"]["prob"])
        assert traj["logit"]["rank"][-1] == 0

        # attribution panel == /api/explain
        code, ex = post(url, "/api/explain", {"prompt": PROMPT, "position": T - 1, "target": " Paris"})
        assert code == 200
        assert page.evaluate("() => window.vl.last.explain") == ex
        bars = dict(page.evaluate("() => document.getElementById('attr-plot').data.map(t => [t.name, t.y])"))
        assert_close(bars["attention"], [bl["attn_dla"] for bl in ex["blocks"]])
        assert_close(bars["FFN"], [bl["mlp_dla"] for bl in ex["blocks"]])
        assert f"{ex['logit_diff_model']:.3f}" in page.inner_text("#attr-summary")
        parts = [(f"block {bl['block']} head {h}", v) for bl in ex["blocks"] for h, v in enumerate(bl["head_dla"])]
        parts += [(f"block {bl['block']} FFN neuron {s['neuron']}", s["dla"]) for bl in ex["blocks"] for s in bl["sub_updates"]]
        biggest = max(parts, key=lambda kv: abs(kv[1]))
        first = page.evaluate("() => [...document.querySelector('#attr-table tr:nth-child(2)').cells].map(c => c.textContent)")
        assert first[0] == biggest[0] and abs(float(first[1]) - biggest[1]) <= 5.1e-4

        # a token anywhere opens its panel: neighbours (value vectors and argmax fill in too)
        page.click("#topk-body button.tok >> nth=1")
        page.wait_for_function("() => document.querySelectorAll('#tok-neighbors button.tok').length >= 10 && "
                               "document.querySelector('#tok-project table')")
        assert "token=" in page.url
        page.wait_for_timeout(500)
        shot = tmp_path / "serve.png"
        page.evaluate("() => window.scrollTo(0, 0)")
        height = page.evaluate("() => document.body.scrollHeight")
        # the README's picture: the heatmap, the cell's top tokens, trajectory and attribution
        page.screenshot(path=str(shot), full_page=True, clip={"x": 0, "y": 0, "width": 1000,
                                                               "height": min(height, 2250)})
        browser.close()
    assert problems == [], problems
    assert outside == [], outside
    keep = os.environ.get("VOCABLENS_SERVE_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)


@pytest.mark.slow
@pytest.mark.browser
def test_explorer_renders_a_one_token_prompt(server):
    """A one-token prompt draws its heatmap (one column, layers 0..L) and explains its one cell. Failed
    before: ``lens --json`` with one position had flat layer entries, so the page's ``.positions[p]``
    ended in "Cannot read properties of undefined (reading '0')" and no heatmap."""
    if not CHROMIUM:
        pytest.skip("Debian's chromium is not installed: apt-get install -y --no-install-recommends chromium")
    from playwright.sync_api import sync_playwright

    url = server
    code, lens = post(url, "/api/lens", {"prompt": "Paris", "kind": "logit", "k": 5})
    assert code == 200 and len(lens["tokens"]) == 1, lens.get("tokens")  # one token in SmolLM2's vocabulary
    problems = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1000, "height": 1500})
        page.set_default_timeout(600_000)
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith((url + "/", "data:", "blob:"))
                   else r.abort())
        page.goto(url + "/")
        page.wait_for_function("() => window.vl && window.vl.health")
        page.fill("#prompt", "Paris")
        page.keyboard.press("Enter")
        page.wait_for_function("() => window.vl.data && document.querySelector('#heatmap .main-svg')")
        L, T, column, tops = page.evaluate("""() => {
            const d = window.vl.data.logit, gd = document.getElementById('heatmap');
            return [d.layers.length - 1, d.tokens.length, gd.data[0].text.map(r => r.length),
                    d.layers.map(l => l.positions[0].top_tokens[0])]; }""")
        assert L == 30 and T == 1 and column == [1] * 31
        assert tops == [ly["positions"][0]["top_tokens"][0] for ly in lens["layers"]]
        page.focus("#heatmap")
        page.keyboard.press("Enter")  # select the cursor's cell: layer L, position 0
        page.wait_for_function("() => window.vl.last.explain && document.querySelectorAll('#attr-table tr').length > 1")
        assert page.evaluate("() => window.vl.cell") == {"layer": L, "pos": 0}
        first = page.evaluate("() => document.querySelector('#attr-table tr:nth-child(2)').cells[0].textContent")
        assert first.startswith("block ")
        browser.close()
    assert problems == [], problems
