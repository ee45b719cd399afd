"""`vocablens serve` in a real browser (Playwright + Debian's chromium): type a prompt, read the heatmap,
click the last cell, and check that the trajectory and attribution panels show what the API answers.

Set VOCABLENS_SERVE_SCREENSHOT=docs/serve.png to keep the screenshot (the README's picture)."""

from __future__ import annotations

import os
import shutil

import pytest

from test_serve import PROMPT, assert_close, post, start_server

from browser import CHROMIUM, require_browser


@pytest.fixture(scope="module")
def server():
    proc, url = start_server()
    yield url
    proc.kill()
    proc.wait()


@pytest.mark.slow
@pytest.mark.browser
def test_explorer_in_headless_chromium(server, tmp_path):
    sync_playwright = require_browser().sync_playwright

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

        # the lens selector: the shipped Jacobian lens is read in the same request and the map shows it
        assert page.evaluate("() => window.vl.health.jacobian") == "loaded"
        page.check("input[name=view][value=jacobian]")
        same, differs, last = page.evaluate("""() => {
            const d = window.vl.data, gd = document.getElementById('heatmap'), z = gd.data[0].z;
            let same = true, differs = false;
            d.jacobian.layers.forEach((ly, l) => ly.positions.forEach((c, p) => {
                same = same && z[l][p] === c.top_probs[0];
                differs = differs || c.top_probs[0] !== d.logit.layers[l].positions[p].top_probs[0]; }));
            return [same && window.vl.map.lens === 'jacobian', differs, gd.data[0].text[d.jacobian.layers.length - 1][4]]; }""")
        assert same and differs and last == "␣Paris"
        page.check("input[name=view][value=logit]")

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


# ------------------------------------------------------------------------------- the explorer's UI
# (issue 25: header, value-vector order, clickable tokens, heatmap text, colour views, export, BOS note)
LONG = ("In the beginning of the twentieth century, the city of Vienna was a centre of music, science and "
        "philosophy, where composers, physicists and writers met in cafes to argue about everything from quantum "
        "mechanics to the meaning of art. ")


@pytest.fixture(scope="module")
def browser():
    sync_playwright = require_browser().sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        yield b
        b.close()


def open_page(browser, url: str, query: str = "", width: int = 1000):
    page = browser.new_page(viewport={"width": width, "height": 1400}, accept_downloads=True)
    page.set_default_timeout(120_000)
    page.problems = []
    page.on("console", lambda m: page.problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: page.problems.append(str(e)))
    page.goto(url + "/" + query)
    page.wait_for_function("() => window.vl && window.vl.health")
    return page


def read(page, prompt: str) -> None:
    n = page.evaluate("() => window.vl.seq") + 1
    page.evaluate("() => { window.vl.map = null; window.vl.cellText = null; }")
    page.fill("#prompt", prompt)
    page.keyboard.press("Enter")
    page.wait_for_function("(n) => window.vl.seq === n && window.vl.map && window.vl.cellText", arg=n)


def prompt_of(smollm2, n: int) -> str:
    """A prompt of exactly n tokens of the default model (no BOS is added: its tokenizer adds none)."""
    tok = smollm2.tokenizer
    ids = tok((LONG * 8), add_special_tokens=False).input_ids
    k = n
    while True:
        text = tok.decode(ids[:k])
        got = len(tok(text).input_ids)
        if got == n:
            return text
        k += n - got


def map_geometry(page) -> dict:
    """Every drawn cell text against its cell, and the x-axis title against the tick labels (px)."""
    return page.evaluate("""() => {
        const gd = document.getElementById('heatmap'), fl = gd._fullLayout, t = gd.data[0];
        const T = window.vl.map.tokens.length, L = window.vl.map.layers.length;
        const cw = fl.xaxis._length / T, ch = fl.yaxis._length / L;
        const widths = t.texttemplate ? t.text.flat().map((s) => textWidth(s, t.textfont.size)) : [];
        const title = gd.querySelector('.g-xtitle text, .xtitle').getBoundingClientRect();
        const ticks = [...gd.querySelectorAll('.xaxislayer-above .xtick text')].map((e) => e.getBoundingClientRect());
        const overlap = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
        const tickClash = ticks.some((a, i) => ticks.some((b, j) => i < j && overlap(a, b)));
        return {cw, ch, font: t.textfont.size, shown: !!t.texttemplate, widest: Math.max(0, ...widths),
                text: t.text, top1: window.vl.map.top1.map((r) => r.map(vis)), titleTop: title.top,
                ticksBottom: Math.max(...ticks.map((r) => r.bottom)), tickClash, nTicks: ticks.length};
    }""")


SIDE_JS = """() => { const gd = document.getElementById('heatmap'), fl = gd._fullLayout, side = document.getElementById('heatmap-side');
    const box = document.getElementById('heatmap-scroll').getBoundingClientRect(), r = gd.getBoundingClientRect();
    const inView = (e) => { const b = e.getBoundingClientRect(); return b.width > 0 && b.left >= box.left - 1 && b.right <= innerWidth; };
    const ticks = [...side.querySelectorAll('.ytick text')].filter(inView);
    const rowOf = Object.fromEntries(ticks.map((e) => { const b = e.getBoundingClientRect(); return [e.textContent, (b.top + b.bottom) / 2]; }));
    const main = Object.fromEntries(Object.keys(rowOf).map((k) => [k, r.top + fl.yaxis._offset + fl.yaxis.l2p(Number(k))]));
    const bar = side.querySelector('.colorbar');
    return {hidden: side.hidden, rowOf, main, bar: !!bar && inView(bar),
            barTicks: bar ? [...bar.querySelectorAll('text')].map((e) => e.textContent) : [],
            mainBarTicks: [...gd.querySelectorAll('.colorbar text')].map((e) => e.textContent),
            title: [...side.querySelectorAll('.g-ytitle text')].map((e) => e.textContent),
            scroll: document.getElementById('heatmap-scroll').scrollLeft,
            page: document.documentElement.scrollWidth, inner: innerWidth}; }"""


def assert_scale_beside_the_map(page) -> None:
    """A map that scrolls opened at the prompt's end, where neither its layer axis (at its left end) nor
    its colour bar (at its right end) was on screen (issue 40, 128 tokens): beside the scrolling box a
    layer axis on the same rows and the same colour bar stay in view wherever the map is scrolled."""
    for left in (None, 0, 2000):
        if left is not None:
            page.evaluate(f"() => {{ document.getElementById('heatmap-scroll').scrollLeft = {left}; }}")
        s = page.evaluate(SIDE_JS)
        assert not s["hidden"] and s["page"] <= s["inner"], s
        assert set(s["rowOf"]) == {"0", "5", "10", "15", "20", "25", "30"} and s["title"] == ["layer"], s
        for k, y in s["rowOf"].items():   # each layer number on its row of the map
            assert abs(y - s["main"][k]) <= 2, (k, y, s["main"][k])
        assert s["bar"] and s["barTicks"] == s["mainBarTicks"] and "p(top-1)" in s["barTicks"], s
        assert left != 2000 or s["scroll"] > 0
    page.select_option("#metric", "rank")   # the log colour scale's ticks follow
    page.wait_for_timeout(300)
    s = page.evaluate(SIDE_JS)
    assert s["barTicks"] == s["mainBarTicks"] and "rank of final top-1" in s["barTicks"], s
    page.select_option("#metric", "p")


@pytest.mark.slow
@pytest.mark.browser
def test_heatmap_text_fits_its_cells_at_5_56_and_128_tokens(server, browser, smollm2, tmp_path):
    page = open_page(browser, server)
    read(page, PROMPT)
    g = map_geometry(page)
    assert g["shown"] and g["widest"] <= g["cw"] - 4 + 0.5  # measured, never wider than its cell
    # wide cells show the whole token: "␣capital" (8 characters) was "␣capi…" with a 6-character cut
    L = len(g["top1"]) - 1
    full = [(r, c) for r in range(L + 1) for c in range(5) if g["text"][r][c] == g["top1"][r][c]]
    assert len(full) == 5 * (L + 1), "a token that fits its cell is drawn whole"
    assert g["titleTop"] >= g["ticksBottom"] and not g["tickClash"]
    page.locator("#heatmap-section").screenshot(path=str(tmp_path / "map5.png"))
    assert page.evaluate("() => document.getElementById('heatmap-side').hidden")  # a map that fits: its own scale
    for n in (56, 128):
        read(page, prompt_of(smollm2, n))
        assert len(page.evaluate("() => window.vl.map.tokens")) == n
        g = map_geometry(page)
        # issue 40: the cells never shrink below a width that holds text; a long prompt's map scrolls
        assert g["shown"] and g["font"] == 10 and g["nTicks"] == n, (n, g["shown"], g["cw"], g["nTicks"])
        assert g["widest"] <= g["cw"] - 4 + 0.5, (n, g["widest"], g["cw"])
        assert g["titleTop"] >= g["ticksBottom"] and not g["tickClash"], n
        page.locator("#heatmap-section").screenshot(path=str(tmp_path / f"map{n}.png"))
    assert_scale_beside_the_map(page)
    assert page.problems == []
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_colour_views_and_the_map_export(server, browser):
    import csv
    import io
    import json as _json
    import math

    page = open_page(browser, server)
    read(page, PROMPT)
    d = page.evaluate("() => window.vl.data.logit")
    cells = [[c for c in ly["positions"]] for ly in d["layers"]]
    want = {"p": lambda c: c["top_probs"][0], "entropy": lambda c: c["entropy"], "kl": lambda c: c["kl_to_final"],
            "rank": lambda c: c["final_top1_rank"] + 1}
    for metric, get in want.items():
        page.select_option("#metric", metric)
        z = page.evaluate("() => document.getElementById('heatmap').data[0].z")
        for row, zr in zip(cells, z):
            for c, v in zip(row, zr):
                expect = math.log10(get(c)) if metric == "rank" else get(c)  # rank: log colour scale
                assert abs(v - expect) <= 1e-9, (metric, v, expect)
        assert f"metric={metric}" in page.url or metric == "p"
        # export: the CSV and the JSON hold the map's values
        with page.expect_download() as dl:
            page.click("#export-csv")
        rows = list(csv.DictReader(io.StringIO(open(dl.value.path(), encoding="utf-8").read())))
        assert len(rows) == len(cells) * len(cells[0])
        for r in rows:
            c = cells[int(r["layer"])][int(r["position"])]
            assert abs(float(r["value"]) - get(c)) <= 1e-9 and r["logit_top1_token"] == c["top_tokens"][0]
            assert r["input_token"] == d["tokens"][int(r["position"])]
        with page.expect_download() as dl:
            page.click("#export-json")
        j = _json.loads(open(dl.value.path(), encoding="utf-8").read())
        assert j["metric"] == metric and j["lens"] == "logit" and j["tokens"] == d["tokens"]
        assert j["z"] == [[get(c) for c in row] for row in cells]
    ticks = page.evaluate("() => document.getElementById('heatmap').data[0].colorbar.ticktext")
    assert ticks[:3] == ["1", "10", "100"]
    with page.expect_download() as dl:
        page.click("#export-png")
    assert open(dl.value.path(), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # the view survives a reload through the URL
    page.goto(page.url)
    page.wait_for_function("() => window.vl.map")
    assert page.evaluate("() => window.vl.metric") == "rank" and page.input_value("#metric") == "rank"
    assert page.problems == []
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_bos_note_follows_the_tokenizer(server, browser, smollm2):
    tok = smollm2.tokenizer
    adds = tok.bos_token_id is not None and tok("a").input_ids[0] == tok.bos_token_id
    assert not adds  # SmolLM2's tokenizer adds no BOS
    page = open_page(browser, server)
    assert page.evaluate("() => window.vl.health.adds_bos") is False
    assert page.is_visible("#bos-note") and "attention-sink artefact" in page.inner_text("#bos-note")
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_value_vectors_sorted_by_z_and_their_tokens_open_the_panel(server, browser):
    code, pr = post(server, "/api/project", {"token": " Paris", "k": 5})
    assert code == 200
    tid = pr["token_id"]
    page = open_page(browser, server, f"?token={tid}")
    page.wait_for_function("() => document.querySelector('#project-table')")
    head = page.evaluate("() => [...document.querySelectorAll('#project-table th')].map(h => [h.textContent, h.title])")
    z_head = next(h for h in head if h[0].startswith("z"))
    assert "z-score" in z_head[1] and "sorted" in z_head[1]
    rows = page.evaluate("""() => [...document.querySelectorAll('#project-table tr[data-side]')].map(tr =>
        [tr.dataset.side, Number(tr.cells[3].textContent), Number(tr.cells[4].textContent), tr.cells[2].textContent])""")
    for side, key, api_rows in (("promotes", lambda r: -r["z"], pr["promote"]), ("suppresses", lambda r: r["z"], pr["suppress"])):
        shown = [r for r in rows if r[0] == side]
        want = sorted(api_rows, key=lambda r: (key(r), r["block"], r["neuron"]))
        assert [r[3] for r in shown] == [str(r["neuron"]) for r in want]
        zs = [r[1] for r in shown]
        assert zs == sorted(zs, reverse=side == "promotes")  # sorted by the column it shows
    # its tokens are buttons with the vector's top ids; a click opens that token's panel
    btn = page.locator("#project-table button.tok").first
    first = pr["promote"] and sorted(pr["promote"], key=lambda r: (-r["z"], r["block"], r["neuron"]))[0]
    assert int(btn.get_attribute("data-id")) == first["top_ids"][0]
    btn.click()
    page.wait_for_function(f"() => window.vl.token === {first['top_ids'][0]}")
    assert f"token={first['top_ids'][0]}" in page.url
    assert page.problems == []
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_attribution_tokens_open_the_token_panel(server, browser):
    page = open_page(browser, server, "?prompt=The+capital+of+France+is&cell=30,4")
    page.wait_for_function("() => window.vl.last.explain && document.querySelector('#attr-table button.tok')")
    ex = page.evaluate("() => window.vl.last.explain")
    ids = {i for bl in ex["blocks"] for s in bl["sub_updates"] for i in s["top_ids"]}
    btn = page.locator("#attr-table button.tok").first
    bid = int(btn.get_attribute("data-id"))
    assert bid in ids
    btn.click()
    page.wait_for_function(f"() => window.vl.token === {bid} && !document.getElementById('token-panel').hidden")
    assert page.problems == []
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_header_follows_the_argmax_scan(server, browser):
    """The header said "argmax scan: pending" forever; it follows /api/health until the scan is done."""
    import time

    from test_serve import get

    page = open_page(browser, server)
    if get(server, "/api/health")["argmax"] == "pending":
        assert page.inner_text("#argmax-scan") == "argmax scan: running…"
    t0 = time.time()
    while get(server, "/api/health")["argmax"] == "pending" and time.time() - t0 < 900:
        time.sleep(2)
    assert get(server, "/api/health")["argmax"] == "done"
    page.wait_for_function("() => document.getElementById('argmax-scan').textContent === 'argmax scan: done'",
                           timeout=15_000)  # without a reload
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_explorer_renders_a_one_token_prompt(server, browser):
    """A one-token prompt draws its heatmap (one column, layers 0..L) and explains its one cell. Failed
    before: ``lens --json`` with one position had flat layer entries, so the page's ``.positions[p]``
    ended in "Cannot read properties of undefined (reading '0')" and no heatmap."""
    url = server
    code, lens = post(url, "/api/lens", {"prompt": "Paris", "kind": "logit", "k": 5})
    assert code == 200 and len(lens["tokens"]) == 1, lens.get("tokens")  # one token in SmolLM2's vocabulary
    page = open_page(browser, url)   # the module's one browser: a second sync_playwright cannot start
    page.fill("#prompt", "Paris")
    page.keyboard.press("Enter")
    page.wait_for_function("() => window.vl.data && window.vl.data.logit && window.vl.data.logit.tokens.length === 1"
                           " && document.querySelector('#heatmap .main-svg')")
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
    assert page.problems == [], page.problems
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_tokens_with_a_backslash_or_a_quote_show_and_round_trip(server, browser, smollm2):
    """A token of a backslash and an n (token_str: ``\\\\n``) showed as ``\\⏎``: the page replaced every
    ``\\n`` pair, so it looked like a backslash and a newline. The page reads token_str's escapes left to
    right as :func:`vocablens.render.tokens.visible` does, and a click on such a token asks the API for
    that exact id."""
    import json

    from vocablens.models.tokens import token_bytes, token_str
    from vocablens.render.tokens import visible

    tok = smollm2.tokenizer
    want = {b"\\n": None, b"\\": None, b'"': None, b"'": None, b'\\"': None}
    for i in range(smollm2.borders.vocab_size):
        b = token_bytes(tok, i)
        if b in want and want[b] is None:
            want[b] = i
    ids = [i for i in want.values() if i is not None]
    assert len(ids) >= 4, want  # SmolLM2 was trained on code: these are tokens of its own
    page = open_page(browser, server)
    asked = []
    page.on("request", lambda r: asked.append(json.loads(r.post_data)["token"])
            if r.url.endswith("/api/neighbors") else None)
    for i in ids:
        text = token_str(tok, i)
        page.evaluate("([t, i]) => { const b = tokButton(t, i); b.id = 'probe'; document.getElementById('probe')?.remove();"
                      " document.body.append(b); }", [text, i])
        assert page.inner_text("#probe") == visible(text), (i, text)
        page.click("#probe")
        page.wait_for_function(f"() => window.vl.token === {i} && document.querySelector('#tok-neighbors button.tok')")
        assert asked[-1] == i
        title = page.inner_text("#token-title span.tok")
        assert title == visible(text), (i, text, title)
    # the panel opened from the URL (no text known) takes the API's token and shows it the same way
    i = want[b"\\n"] if want[b"\\n"] is not None else ids[0]
    page.goto(f"{server}/?token={i}")
    page.wait_for_function("() => document.querySelector('#token-title span.tok').textContent !== '…'")
    assert page.inner_text("#token-title span.tok") == visible(token_str(tok, i))
    assert page.problems == [], page.problems
    page.close()


# --------------------------------------------------------------------------------- issue 40, faults 2, 3
def panels(page) -> dict:
    """What the cell and token panels show: hidden or not, and their text."""
    return page.evaluate("""() => Object.fromEntries(['cell-panel', 'token-panel'].map((id) => {
        const e = document.getElementById(id);
        return [id, {hidden: e.hidden, text: e.innerText.replace(/\\s+/g, ' ').trim()}]; }))""")


@pytest.mark.slow
@pytest.mark.browser
def test_a_new_prompt_clears_the_previous_prompts_panels(server, browser):
    """The cell and token panels of "The capital of France is" ("Layer 30, position 4 (after ␣is) ...
    ␣Paris") stayed under the next prompt's map: every panel belongs to the prompt on screen, and
    answers that come back for a previous prompt's panel are dropped."""
    page = open_page(browser, server, "?prompt=" + PROMPT.replace(" ", "+") + "&cell=30,4")
    page.wait_for_function("() => window.vl.last.trajectory && window.vl.last.explain && "
                           "document.querySelectorAll('#cell-neighbors-body button.tok').length")
    page.click("#topk-body button.tok >> nth=0")
    page.wait_for_function("() => document.querySelectorAll('#tok-neighbors button.tok').length && "
                           "window.vl.last.project")
    before = panels(page)
    assert not before["cell-panel"]["hidden"] and "after ␣is" in before["cell-panel"]["text"]
    assert not before["token-panel"]["hidden"] and "␣Paris" in before["token-panel"]["text"]
    # a cell of the first prompt asked for, then a new prompt read before its answers come back
    page.evaluate("() => window.selectCell(3, 2)")
    read(page, "One, two, three, four")
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(300)
    after = panels(page)
    assert after["cell-panel"] == {"hidden": True, "text": ""} or (after["cell-panel"]["hidden"] and
                                                                   "Paris" not in after["cell-panel"]["text"])
    assert after["cell-panel"]["hidden"] and after["token-panel"]["hidden"]
    for box in ("cell-title", "topk-body", "cell-neighbors-body", "traj-table", "attr-summary", "attr-table",
                "token-title", "tok-neighbors", "tok-argmax", "tok-project"):
        assert page.inner_text("#" + box).strip() == "", box
    assert page.evaluate("() => [window.vl.cell, window.vl.token, Object.keys(window.vl.last)]") == [None, None, ["lens"]]
    assert "cell=" not in page.url and "token=" not in page.url and "One" in page.url
    # a cell of the new prompt opens panels about the new prompt
    page.focus("#heatmap")
    page.keyboard.press("Enter")
    page.wait_for_function("() => window.vl.last.trajectory")
    assert "after ␣four" in page.inner_text("#cell-title") and "Paris" not in page.inner_text("#cell-title")
    assert page.problems == []
    page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_the_map_at_110_tokens_says_what_every_cell_predicts(server, browser, smollm2, tmp_path):
    """At 110 tokens the map showed colour only (no text in the cells, every second x-label): the cells
    keep a width that holds text, the map scrolls sideways inside its box (the page does not), every
    position has its label, every cell its hover, and the hover is readable on screen."""
    page = open_page(browser, server)
    read(page, prompt_of(smollm2, 110))
    g = map_geometry(page)
    assert len(g["top1"][0]) == 110
    assert g["shown"] and g["cw"] >= 36 and g["font"] >= 10 and g["nTicks"] == 110
    assert g["widest"] <= g["cw"] - 4 + 0.5 and not g["tickClash"]
    # text where it fits: every cell has text, the whole token wherever it is that narrow
    assert all(t for row in g["text"] for t in row)
    whole = sum(t == v for tr, vr in zip(g["text"], g["top1"]) for t, v in zip(tr, vr))
    assert whole >= 0.5 * 110 * len(g["text"]), whole
    box = page.evaluate("""() => { const b = document.getElementById('heatmap-scroll');
        return {sw: b.scrollWidth, cw: b.clientWidth, left: b.scrollLeft,
                page: document.documentElement.scrollWidth, inner: window.innerWidth}; }""")
    assert box["sw"] > box["cw"] and box["page"] <= box["inner"], box   # the map scrolls, the page does not
    assert box["left"] > 0   # scrolled to the cursor (the last position, the prompt's end)
    # every cell's hover names its layer, position, input token and top-1 token
    bad = page.evaluate("""() => { const M = window.vl.map, out = [];
        M.hover.forEach((row, l) => row.forEach((h, p) => {
            if (!h.includes(`layer ${l}, position ${p} (${vis(M.tokens[p])})`) || !h.includes(`top-1 ${vis(M.top1[l][p])} `))
                out.push([l, p]); }));
        return out; }""")
    assert bad == []
    # a real hover over a cell at the start of the map (scrolled back into view): readable, on screen
    page.evaluate("() => { document.getElementById('heatmap-scroll').scrollLeft = 0; }")
    x, y = page.evaluate("""() => { const gd = document.getElementById('heatmap'), fl = gd._fullLayout,
        r = gd.getBoundingClientRect();
        return [r.left + fl.xaxis._offset + fl.xaxis.l2p(3), r.top + fl.yaxis._offset + fl.yaxis.l2p(12)]; }""")
    page.mouse.move(x, y)
    page.wait_for_selector("#heatmap .hoverlayer .hovertext")
    hover = page.evaluate("""() => { const h = document.querySelector('#heatmap .hoverlayer .hovertext'),
        r = h.getBoundingClientRect(), t = h.querySelector('text');
        return {text: h.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom,
                size: parseFloat(getComputedStyle(t).fontSize), w: window.innerWidth, h: window.innerHeight}; }""")
    want = page.evaluate("() => `top-1 ${vis(window.vl.map.top1[12][3])} `")
    assert "layer 12, position 3" in hover["text"] and want in hover["text"], hover
    assert hover["size"] >= 12 and hover["left"] >= 0 and hover["right"] <= hover["w"], hover
    assert hover["top"] >= 0 and hover["bottom"] <= hover["h"], hover
    # the keyboard cursor scrolls the map with it (from the map's start, 41 cells to the right)
    page.mouse.move(0, 0)
    page.evaluate("() => { window.vl.cursor = {layer: 12, pos: 3}; document.getElementById('heatmap-scroll').scrollLeft = 0; }")
    page.focus("#heatmap")
    for _ in range(41):
        page.keyboard.press("ArrowRight")
    assert page.evaluate("() => window.vl.cursor.pos") == 44
    seen = page.evaluate("""() => { const b = document.getElementById('heatmap-scroll'), gd = document.getElementById('heatmap'),
        fl = gd._fullLayout, x = fl.xaxis._offset + fl.xaxis.l2p(44);
        return [b.scrollLeft, x, b.clientWidth]; }""")
    assert seen[0] > 0 and seen[0] <= seen[1] <= seen[0] + seen[2], seen
    page.locator("#heatmap-section").screenshot(path=str(tmp_path / "map110.png"))
    assert page.problems == []
    page.close()

