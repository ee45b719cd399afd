// vocablens serve: the page. Vanilla JS + plotly.js (served by the same server). No build step.
// Every number comes from the JSON API (/openapi.json); tokens are shown with visible whitespace.
"use strict";

const $ = (id) => document.getElementById(id);
const S = { prompt: "", chat: false, view: "logit", metric: "p", cell: null, token: null, data: null, health: null,
            cursor: null, seq: 0, cellSeq: 0, tokenSeq: 0 };
window.vl = S;  // for the tests and the curious: the state and the last answers (S.last)
S.last = {};

// ------------------------------------------------------------------------------------------ helpers
// token_str escapes a backslash as \\ and control characters as \n, \t, \r, \xNN, \uNNNN; read them
// left to right, as vocablens.render.tokens.visible does: a token of a backslash and an n (token_str:
// the three characters \\n) is no newline and shows as \\n (it showed as \⏎ when every \n was replaced)
const VIS = { " ": "␣", "\u00a0": "⍽", "\\n": "⏎", "\\t": "⇥", "\\r": "⇤", "\\u00a0": "⍽" };
const VIS_RE = /\\(?:[\\ntr]|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})| |\u00a0/g;
function vis(t) {
  return String(t).replace(VIS_RE, (m) => VIS[m] ?? m);
}
function short(t, n) { t = vis(t); return t.length > n ? t.slice(0, n - 1) + "…" : t; }
let _ctx = null;
function textWidth(t, px) {
  // the width in CSS px of t in plotly's default font at size px (canvas measureText)
  if (!_ctx) _ctx = document.createElement("canvas").getContext("2d");
  _ctx.font = `${px}px "Open Sans", verdana, arial, sans-serif`;
  return _ctx.measureText(t).width;
}
function fit(t, width, px) {
  // vis(t) cut (with …) to what fits in width px at font size px: measured, not a fixed count
  t = vis(t);
  if (textWidth(t, px) <= width) return t;
  const chars = [...t];
  let lo = 0, hi = chars.length;
  while (lo < hi) {  // the longest prefix p with width(p + "…") <= width
    const mid = (lo + hi + 1) >> 1;
    if (textWidth(chars.slice(0, mid).join("") + "…", px) <= width) lo = mid; else hi = mid - 1;
  }
  return lo === 0 ? "" : chars.slice(0, lo).join("") + "…";
}
function download(name, text, mime) {
  const a = el("a", { href: URL.createObjectURL(new Blob([text], { type: mime })), download: name });
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}
const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtons: [["toImage"]],
                      toImageButtonOptions: { format: "png", scale: 2 } };
function fmt(x, d = 3) { return x === null || x === undefined ? "–" : Number(x).toFixed(d); }
function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
}
function status(msg, isError = false) { const s = $("status"); s.textContent = msg; s.classList.toggle("error", isError); }

async function api(path, body) {
  const r = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" },
                                body: JSON.stringify(body) });
  const d = await r.json();
  if (!r.ok) throw new Error(d.error || r.statusText);
  return { status: r.status, data: d };
}

function tokButton(text, id) {
  // a token anywhere on the page: click (or Enter) opens its token panel
  return el("button", { class: "tok", type: "button", title: `id ${id}: click for neighbours, argmax, value vectors`,
                        "data-id": id, text: vis(text), onclick: () => selectToken(id, text) });
}

function tokList(texts, ids, n) {
  // tokens in a row of a table: buttons that open the token panel (plain text when no id came)
  return el("span", { class: "toks" }, ...(texts || []).slice(0, n).map((x, i) =>
    ids && ids[i] !== undefined ? tokButton(x, ids[i]) : el("span", { class: "tok", text: vis(x) })));
}

// ---------------------------------------------------------------------------------------------- URL
function writeURL() {
  const q = new URLSearchParams();
  if (S.prompt) q.set("prompt", S.prompt);
  if (S.chat) q.set("chat", "1");
  if (S.view !== "logit") q.set("view", S.view);
  if (S.metric !== "p") q.set("metric", S.metric);
  if (S.cell) q.set("cell", `${S.cell.layer},${S.cell.pos}`);
  if (S.token !== null) q.set("token", String(S.token));
  history.replaceState(null, "", "?" + q.toString());
}
function readURL() {
  const q = new URLSearchParams(location.search);
  const cell = (q.get("cell") || "").split(",").map(Number);
  return { prompt: q.get("prompt") || "", chat: q.get("chat") === "1",
           view: ["logit", "tuned", "jacobian", "diff"].includes(q.get("view")) ? q.get("view") : "logit",
           metric: Object.keys(METRICS).includes(q.get("metric")) ? q.get("metric") : "p",
           cell: cell.length === 2 && cell.every(Number.isInteger) ? { layer: cell[0], pos: cell[1] } : null,
           token: /^\d+$/.test(q.get("token") || "") ? Number(q.get("token")) : null };
}

// ------------------------------------------------------------------------------------------ heatmap
function lensOf(name) {
  const d = S.data;
  if (!d) return null;
  // one kind: the answer is that lens; several ("both", "logit,tuned,jacobian"): one entry per kind
  return d.kind === name ? d : (d[name] || null);
}
function qualityAt(name, l) {
  // the lens's stored quality at layer l (lens --json "lenses"): held-out KL and top-1, beside the logit lens's
  const rec = ((S.data && S.data.lenses) || []).find((r) => r.kind === name);
  const q = rec && rec.quality;
  if (!q || !q.kl || q.kl[l] === null || q.kl[l] === undefined) return "";
  return `<br>${name} lens at this layer on held-out ${q.corpus || "text"}: KL ${fmt(q.kl[l], 2)} nats, ` +
         `top-1 ${fmt(100 * q.top1[l], 0)}% (logit lens: ${fmt(q.logit_kl[l], 2)} nats, ${fmt(100 * q.logit_top1[l], 0)}%)`;
}
function cellOf(name, layer, pos) {
  const d = lensOf(name);
  return d ? d.layers[layer].positions[pos] : null;
}

// what colours the map: the lens's reading of every cell, as the report's lens tables show it
const METRICS = {
  p: { label: "p(top-1)", title: "probability of the lens's top-1 token", get: (c) => c.top_probs[0],
       show: (v) => fmt(v, 3), lo: 0, hi: 1 },
  entropy: { label: "entropy (nats)", title: "entropy of the lens's distribution, nats", get: (c) => c.entropy,
             show: (v) => fmt(v, 2) + " nats", lo: 0, hi: null },
  kl: { label: "KL to final (nats)", title: "KL(final ‖ layer), nats: how far this layer's reading is from the model's output",
        get: (c) => c.kl_to_final, show: (v) => fmt(v, 2) + " nats", lo: 0, hi: null },
  rank: { label: "rank of final top-1", title: "rank (1 = top) of the model's final top-1 token in this layer's reading; log colour scale",
          get: (c) => c.final_top1_rank + 1, show: (v) => String(v), lo: 0, hi: null, log: true },
};
const CELL_PX = { font: 10, small: 8 };
// the narrowest cell the map draws: wide enough for a cut token ("␣twen…") at CELL_PX.font; a long
// prompt makes the map wider than the page and its box scrolls sideways (it never hides the text)
const MIN_CELL_W = 42;
const MAP_CHROME_W = 150;  // the layer axis, the colour bar and the margins beside the cells (px)
const SIDE_W = 150;  // the layer axis and colour bar kept beside a map that scrolls (px)

function mapModel() {
  // the map as numbers: {lens, metric, tokens, z [L][T] (the metric; the difference tuned − logit in
  // the diff view), top1 [L][T], hover [L][T]}; z is what the colour shows (rank: the rank itself)
  const lo = lensOf("logit"), tu = lensOf("tuned");
  const diff = S.view === "diff" && tu;
  const base = (S.view === "tuned" || S.view === "jacobian") && lensOf(S.view) ? lensOf(S.view) : lo;
  const m = METRICS[S.metric];
  const L = base.layers.length, T = base.tokens.length;
  const z = [], top1 = [], hover = [];
  for (let l = 0; l < L; l++) {
    const zr = [], tr = [], hr = [];
    for (let p = 0; p < T; p++) {
      const c = base.layers[l].positions[p];
      if (diff) {
        const a = lo.layers[l].positions[p], b = tu.layers[l].positions[p];
        const v = S.metric === "p" ? b.final_top1_prob - a.final_top1_prob : m.get(b) - m.get(a);
        zr.push(v); tr.push(b.top_tokens[0]);
        hr.push(`layer ${l}, position ${p} (${vis(base.tokens[p])})<br>logit top-1 ${vis(a.top_tokens[0])} (${fmt(a.top_probs[0])})` +
                `<br>tuned top-1 ${vis(b.top_tokens[0])} (${fmt(b.top_probs[0])})` +
                (S.metric === "p" ? `<br>p(final top-1): tuned − logit = ${fmt(v)}`
                                  : `<br>${m.label}: tuned − logit = ${fmt(v)}`));
      } else {
        const v = m.get(c);
        zr.push(v); tr.push(c.top_tokens[0]);
        hr.push(`layer ${l}, position ${p} (${vis(base.tokens[p])})<br>top-1 ${vis(c.top_tokens[0])} ` +
                `p=${fmt(c.top_probs[0])}<br>entropy ${fmt(c.entropy, 2)} nats; KL to final ${fmt(c.kl_to_final, 2)} nats` +
                `<br>rank of final top-1: ${c.final_top1_rank + 1}` + qualityAt(base === lo ? "logit" : S.view, l));
      }
    }
    z.push(zr); top1.push(tr); hover.push(hr);
  }
  return { lens: diff ? "tuned − logit" : (base === lo ? "logit" : S.view), metric: S.metric,
           metric_label: diff && S.metric === "p" ? "Δp final top-1 (tuned − logit)" : m.label,
           tokens: base.tokens, layers: [...Array(L).keys()], z, top1, hover, diff: !!diff };
}

function cellTexts(M, cellW, cellH) {
  // the top-1 token of each cell, cut to the cell's measured width; none when the cells are too small
  const px = cellW >= 40 && cellH >= 14 ? CELL_PX.font : CELL_PX.small;
  const show = cellW >= 18 && cellH >= px + 3;
  return { px, show, text: M.top1.map((r) => r.map((t) => (show ? fit(t, cellW - 4, px) : ""))) };
}

function heatmapTraces(M, texts) {
  const m = METRICS[S.metric];
  let z = M.z, zmin = m.lo, zmax = m.hi, colorbar = { title: { text: M.metric_label, side: "right" }, thickness: 12 };
  const flat = M.z.flat().filter((v) => Number.isFinite(v));
  if (M.diff) {
    const a = S.metric === "p" ? 1 : Math.max(1e-9, ...flat.map(Math.abs));
    zmin = -a; zmax = a;
  } else if (m.log) {  // rank: colour by log10(rank), ticks at the ranks
    z = M.z.map((r) => r.map((v) => Math.log10(v)));
    zmax = Math.max(1, Math.log10(Math.max(...flat)));
    const ticks = [...Array(Math.ceil(zmax) + 1).keys()];
    Object.assign(colorbar, { tickvals: ticks, ticktext: ticks.map((k) => (10 ** k).toLocaleString("en")) });
  } else if (zmax === null) {
    zmax = Math.max(1e-9, ...flat);
  }
  return [{ type: "heatmap", z, text: texts.text, customdata: M.hover, x: M.tokens.map((_, i) => i), y: M.layers,
            texttemplate: texts.show ? "%{text}" : "", textfont: { size: texts.px },
            hovertemplate: "%{customdata}<extra></extra>",
            colorscale: M.diff ? "RdBu" : "Viridis", reversescale: !M.diff && S.metric !== "p",
            zmin, zmax, zmid: M.diff ? 0 : undefined, xgap: 1, ygap: 1, colorbar }];
}

function heatmapLayout(M, plotW, width) {
  const T = M.tokens.length, L = M.layers.length;
  const cellW = plotW / T;
  const tickPx = 10;
  // tick labels: every position when there is room, else every n-th; each cut to a measured width
  const every = Math.max(1, Math.ceil((tickPx + 4) / cellW));
  const vals = M.tokens.map((_, i) => i).filter((i) => i % every === 0);
  if (T - 1 - vals[vals.length - 1] >= every) vals.push(T - 1);
  const angle = cellW >= 70 ? 0 : -90;
  const room = angle === 0 ? cellW * every - 6 : 80;
  return {
    margin: { l: 56, r: 10, t: 10, b: 10 }, height: Math.max(320, 16 * L + 150), width,
    // the hover says what every cell predicts, whatever the cell's size
    hoverlabel: { font: { size: 13, family: "ui-monospace, DejaVu Sans Mono, monospace" }, align: "left",
                  bgcolor: "white", bordercolor: "#6e6e73" },
    xaxis: { tickmode: "array", tickvals: vals, ticktext: vals.map((i) => fit(M.tokens[i], room, tickPx)),
             tickangle: angle, tickfont: { size: tickPx }, automargin: true,
             title: { text: "position (input token)", standoff: 12 }, fixedrange: true },
    yaxis: { title: { text: "layer", standoff: 8 }, fixedrange: true, dtick: L > 12 ? 5 : 1, automargin: true },
    shapes: cursorShape(),
  };
}

function cursorShape() {
  const c = S.cursor;
  if (!c) return [];
  return [{ type: "rect", x0: c.pos - 0.5, x1: c.pos + 0.5, y0: c.layer - 0.5, y1: c.layer + 0.5,
            line: { color: "#f5a623", width: 3 } }];
}

function drawHeatmap() {
  const base = lensOf("logit") || lensOf("tuned");
  if (!base) return;
  const M = mapModel();
  S.map = M;
  const gd = $("heatmap"), T = M.tokens.length;
  // cells of at least MIN_CELL_W px: a long prompt widens the map past its box, which scrolls sideways,
  // with the layer axis and the colour bar kept in view beside it (drawSide)
  const scrolls = T * MIN_CELL_W + MAP_CHROME_W > $("heatmap-row").clientWidth;
  $("heatmap-side").hidden = !scrolls;
  const room = Math.max(320, $("heatmap-scroll").clientWidth);
  let width = Math.max(room, T * MIN_CELL_W + MAP_CHROME_W);
  gd.style.width = width > room ? `${width}px` : "";
  // first guess of the plot area (the colour bar and the axis labels take ~150 px), then the real one
  let plotW = Math.max(100, width - MAP_CHROME_W);
  let layout = heatmapLayout(M, plotW, width);
  let texts = cellTexts(M, plotW / T, (layout.height - 150) / M.layers.length);
  Plotly.react(gd, heatmapTraces(M, texts), layout, { ...PLOT_CONFIG, toImageButtonOptions:
    { ...PLOT_CONFIG.toImageButtonOptions, filename: "vocablens-lens-map" } });
  const fl = gd._fullLayout;
  let w = fl.xaxis._length;
  if (width > room && w < T * MIN_CELL_W - 1) {  // the margins took more than guessed: widen by that
    width += T * MIN_CELL_W - w;
    gd.style.width = `${width}px`;
  }
  if (Math.abs(w - plotW) > 2 || width !== layout.width) {
    plotW = width === layout.width ? w : T * MIN_CELL_W;
    layout = heatmapLayout(M, plotW, width);
    const again = cellTexts(M, plotW / T, fl.yaxis._length / M.layers.length);
    Plotly.react(gd, heatmapTraces(M, again), layout, gd._context);
  }
  w = gd._fullLayout.xaxis._length;
  const h = gd._fullLayout.yaxis._length;
  const again = cellTexts(M, w / T, h / M.layers.length);
  if (JSON.stringify(again.text) !== JSON.stringify(gd.data[0].text) || (again.show ? "%{text}" : "") !== gd.data[0].texttemplate) {
    Plotly.react(gd, heatmapTraces(M, again), layout, gd._context);
  }
  S.cellText = { width: w / M.tokens.length, height: h / M.layers.length, show: again.show, px: again.px };
  drawSide(scrolls);
  scrollToCursor();
  if (!gd._vlBound) {
    gd._vlBound = true;
    gd.on("plotly_click", (ev) => { const p = ev.points[0]; selectCell(p.y, p.x); });
  }
}

function drawSide(scrolls) {
  // a map wider than its box scrolls: its own layer axis and colour bar scroll out of view, so a copy
  // of both (same rows, same scale) stays beside the box
  const side = $("heatmap-side"), gd = $("heatmap");
  if (!scrolls) { Plotly.purge(side); return; }
  const fl = gd._fullLayout, t = gd._fullData[0], d = gd.data[0];
  const marker = { color: [t.zmin], cmin: t.zmin, cmax: t.zmax, cmid: d.zmid, colorscale: d.colorscale,
                   reversescale: d.reversescale, showscale: true, opacity: 0,
                   colorbar: { ...d.colorbar, x: 1, xanchor: "left", xpad: 6, len: 1, y: 0.5, yanchor: "middle" } };
  Plotly.react(side, [{ type: "scatter", mode: "markers", x: [0], y: [fl.yaxis.range[0]], marker, hoverinfo: "skip" }],
    { width: SIDE_W, height: fl.height, showlegend: false, margin: { l: 46, r: SIDE_W - 50, t: fl._size.t, b: fl._size.b },
      xaxis: { visible: false, range: [1, 2], fixedrange: true },
      yaxis: { range: fl.yaxis.range, dtick: fl.yaxis.dtick, fixedrange: true, automargin: false, showgrid: false,
               zeroline: false, title: { text: "layer", standoff: 6 } },
      plot_bgcolor: "rgba(0,0,0,0)", paper_bgcolor: "rgba(0,0,0,0)" },
    { displayModeBar: false, staticPlot: true });
}

// ------------------------------------------------------------------------------------------ export
function mapCSV() {
  // one row per cell: the map's value and every reading of the cell (both lenses when loaded)
  const M = S.map, lo = lensOf("logit"), tu = lensOf("tuned");
  const q = (v) => { const t = String(v); return /[",\n\r]/.test(t) ? `"${t.replace(/"/g, '""')}"` : t; };
  const head = ["layer", "position", "input_token", "value", "lens"];
  const cols = ["top1_token", "top1_id", "top1_prob", "entropy", "kl_to_final", "final_top1_rank", "final_top1_prob"];
  const lenses = [["logit", lo], ["tuned", tu], ["jacobian", lensOf("jacobian")]].filter(([, d]) => d);
  const rows = [head.concat(...lenses.map(([n]) => cols.map((c) => `${n}_${c}`))).join(",")];
  for (let l = 0; l < M.layers.length; l++) {
    for (let p = 0; p < M.tokens.length; p++) {
      const r = [l, p, q(M.tokens[p]), M.z[l][p], q(M.lens)];
      for (const [, d] of lenses) {
        const c = d.layers[l].positions[p];
        r.push(q(c.top_tokens[0]), c.top_ids[0], c.top_probs[0], c.entropy, c.kl_to_final, c.final_top1_rank,
               c.final_top1_prob);
      }
      rows.push(r.join(","));
    }
  }
  return rows.join("\n") + "\n";
}
function mapJSON() {
  const M = S.map;
  return JSON.stringify({ prompt: S.prompt, chat: S.chat, model: S.health ? S.health.provenance : null,
                          lens: M.lens, metric: M.metric, metric_label: M.metric_label, tokens: M.tokens,
                          layers: M.layers, z: M.z, top1: M.top1 }, null, 1);
}
function exportMap(kind) {
  if (!S.map) { status("Read a prompt first.", true); return; }
  const name = `vocablens-lens-${M_name()}`;
  if (kind === "csv") download(name + ".csv", mapCSV(), "text/csv");
  else if (kind === "json") download(name + ".json", mapJSON(), "application/json");
  else Plotly.downloadImage($("heatmap"), { format: "png", filename: name, scale: 2 });
}
function M_name() { return `${S.map.lens.replace(/[^a-z]+/g, "-")}-${S.map.metric}`; }

function scrollToCursor() {
  // keep the cursor's cell inside the scrolling box (a map wider than the page)
  const box = $("heatmap-scroll"), gd = $("heatmap"), fl = gd._fullLayout, c = S.cursor;
  if (!c || !fl || !fl.xaxis || box.scrollWidth <= box.clientWidth) return;
  const x = fl.xaxis._offset + fl.xaxis.l2p(c.pos), half = fl.xaxis._length / M_cells() / 2 + 8;
  if (x - half < box.scrollLeft) box.scrollLeft = Math.max(0, x - half - 60);
  else if (x + half > box.scrollLeft + box.clientWidth) box.scrollLeft = x + half + 60 - box.clientWidth;
}
function M_cells() { return S.map ? S.map.tokens.length : 1; }

function moveCursor(dl, dp) {
  const base = lensOf("logit") || lensOf("tuned");
  if (!base) return;
  const L = base.layers.length, T = base.tokens.length;
  const c = S.cursor || { layer: L - 1, pos: T - 1 };
  S.cursor = { layer: Math.min(L - 1, Math.max(0, c.layer + dl)), pos: Math.min(T - 1, Math.max(0, c.pos + dp)) };
  Plotly.relayout("heatmap", { shapes: cursorShape() });
  scrollToCursor();
}

// -------------------------------------------------------------------------------------------- lens
async function run() {
  const prompt = $("prompt").value;
  if (!prompt.trim()) { status("Type a prompt first.", true); return; }
  S.prompt = prompt; S.chat = $("chat").checked;
  const seq = ++S.seq;
  status("Reading every layer and position…");
  // every lens the server holds, read in one request (the map switches between them without another)
  const kinds = ["logit", ...["tuned", "jacobian"].filter((k) => S.health && S.health[k] === "loaded")];
  const kind = kinds.join(",") === "logit,tuned" ? "both" : kinds.join(",");
  const t0 = performance.now();
  try {
    const { data } = await api("/api/lens", { prompt: S.prompt, kind, k: 5, chat: S.chat });
    if (seq !== S.seq) return;
    clearPanels();
    S.data = data; S.last.lens = data;
    const base = lensOf("logit");
    S.cursor = { layer: base.layers.length - 1, pos: base.tokens.length - 1 };
    drawHeatmap();
    status(`${base.tokens.length} tokens × ${base.layers.length} layers in ${((performance.now() - t0) / 1000).toFixed(2)} s` +
           (kind === "logit" ? " (no tuned lens for this model)" : ""));
    writeURL();
  } catch (e) { status(e.message, true); }
}

function clearPanels() {
  // every panel belongs to the prompt on screen: a new prompt's map closes the previous prompt's cell
  // and token panels, empties them, and drops their answers (late ones are dropped: cellSeq, tokenSeq)
  S.cell = null; S.token = null; S.cellSeq++; S.tokenSeq++; S.last = {};
  $("cell-panel").hidden = true; $("token-panel").hidden = true;
  for (const id of ["cell-title", "cell-token", "traj-token", "attr-token", "topk-body", "cell-neighbors-body",
                    "traj-table", "attr-summary", "attr-table", "token-title", "tok-neighbors", "tok-argmax",
                    "tok-undertrained", "tok-project"]) $(id).replaceChildren();
  for (const id of ["traj-plot", "attr-plot"]) Plotly.purge($(id));
}

// -------------------------------------------------------------------------------------------- cell
function selectCell(layer, pos) {
  if (!S.data) return;
  S.cell = { layer, pos }; S.cursor = { layer, pos }; S.cellSeq++;
  scrollToCursor();
  Plotly.relayout("heatmap", { shapes: cursorShape() });
  const name = (S.view === "tuned" || S.view === "jacobian") && lensOf(S.view) ? S.view : "logit";
  const c = cellOf(name, layer, pos);
  const tok = { id: c.top_ids[0], text: c.top_tokens[0] };
  const base = lensOf(name);
  $("cell-panel").hidden = false;
  $("cell-title").textContent = `Layer ${layer}, position ${pos} (after ${vis(base.tokens[pos])}): ${name} lens top-1 ${vis(tok.text)}`;
  for (const id of ["cell-token", "traj-token", "attr-token"]) $(id).replaceChildren(tokButton(tok.text, tok.id));
  drawTopk(layer, pos);
  writeURL();
  loadTrajectory(pos, tok);
  loadPatch(pos, String(base.tokens[pos]));
  if (!String(base.tokens[pos]).startsWith("<image ")) loadExplain(pos, tok);
  else $("attr-summary").textContent = "the attribution does not read images yet";
  const seq = S.cellSeq;
  loadNeighbors(tok.id, $("cell-neighbors-body"), null, () => S.cellSeq === seq);
}

function drawTopk(layer, pos) {
  const body = $("topk-body");
  body.replaceChildren();
  for (const name of ["logit", "tuned", "jacobian"]) {
    const c = cellOf(name, layer, pos);
    if (!c) continue;
    const t = el("table", {}, el("tr", {}, el("th", { class: "l", text: `${name} lens` }), el("th", { text: "p" })));
    c.top_tokens.forEach((tt, i) => t.append(el("tr", {}, el("td", { class: "l" }, tokButton(tt, c.top_ids[i])),
                                                   el("td", { text: fmt(c.top_probs[i], 4) }))));
    body.append(el("div", { class: "topk-col", "data-lens": name }, t,
                   el("p", { class: "dim", text: `entropy ${fmt(c.entropy, 2)} nats; KL to final ${fmt(c.kl_to_final, 2)} nats` })));
  }
}

async function loadTrajectory(pos, tok) {
  const seq = S.cellSeq;
  $("traj-table").replaceChildren();
  try {
    const { data } = await api("/api/trajectory", { prompt: S.prompt, chat: S.chat, position: pos, token: tok.id });
    if (seq !== S.cellSeq) return;
    S.last.trajectory = data;
    const layers = [...Array(data.n_layers + 1).keys()], traces = [];
    for (const [name, colour] of [["logit", "#0b5cad"], ["tuned", "#e4572e"]]) {
      const d = data[name];
      if (!d) continue;
      traces.push({ x: layers, y: d.rank.map((r) => r + 1), name: `${name}: rank`, mode: "lines+markers",
                    line: { color: colour }, customdata: d.top1.map(vis),
                    hovertemplate: "layer %{x}: rank %{y} (top-1 there: %{customdata})<extra></extra>" });
      traces.push({ x: layers, y: d.prob, name: `${name}: p`, yaxis: "y2", mode: "lines",
                    line: { color: colour, dash: "dot" }, hovertemplate: "layer %{x}: p=%{y:.4f}<extra></extra>" });
    }
    Plotly.react("traj-plot", traces, {
      margin: { l: 50, r: 50, t: 10, b: 40 }, height: 300, legend: { orientation: "h", y: 1.12 },
      xaxis: { title: { text: "layer" } }, yaxis: { title: { text: "rank (1 = top)" }, type: "log", autorange: "reversed" },
      yaxis2: { title: { text: "probability" }, overlaying: "y", side: "right", range: [0, 1], tickmode: "linear",
                tick0: 0, dtick: 0.2, showgrid: false },
    }, { ...PLOT_CONFIG, toImageButtonOptions: { ...PLOT_CONFIG.toImageButtonOptions, filename: "vocablens-trajectory" } });
    const t = $("traj-table");
    t.append(el("tr", {}, ...["layer", "logit rank", "logit p", "tuned rank", "tuned p"].map((h) => el("th", { text: h }))));
    for (const l of layers) {
      t.append(el("tr", {}, el("td", { text: String(l) }),
        el("td", { text: String(data.logit.rank[l]) }), el("td", { text: fmt(data.logit.prob[l], 4) }),
        el("td", { text: data.tuned ? String(data.tuned.rank[l]) : "–" }),
        el("td", { text: data.tuned ? fmt(data.tuned.prob[l], 4) : "–" })));
    }
  } catch (e) { status(e.message, true); }
}

async function loadPatch(pos, label) {
  // an image position (labelled "<image k/n>" by the server): the patch of the image the model saw there
  const seq = S.cellSeq;
  $("patch").hidden = !label.startsWith("<image ");
  if ($("patch").hidden) return;
  $("patch-label").textContent = label;
  $("patch-note").textContent = "loading…";
  try {
    const { data } = await api("/api/patch", { prompt: S.prompt, position: pos });
    if (seq !== S.cellSeq) return;
    $("patch-img").src = data.png;
    $("patch-note").textContent = `pixels ${data.box[0]}–${data.box[2]} × ${data.box[1]}–${data.box[3]} of the ` +
      `${data.size[0]}×${data.size[1]} image the model read`;
  } catch (e) { $("patch-note").textContent = e.message; }
}

async function loadExplain(pos, tok) {
  const seq = S.cellSeq;
  $("attr-table").replaceChildren();
  $("attr-summary").textContent = "computing…";
  try {
    const { data } = await api("/api/explain", { prompt: S.prompt, chat: S.chat, position: pos, target: tok.id });
    if (seq !== S.cellSeq) return;
    S.last.explain = data;
    const blocks = data.blocks.map((b) => b.block);
    Plotly.react("attr-plot", [
      { type: "bar", x: blocks, y: data.blocks.map((b) => b.attn_dla), name: "attention", marker: { color: "#0b5cad" } },
      { type: "bar", x: blocks, y: data.blocks.map((b) => b.mlp_dla), name: "FFN", marker: { color: "#e4572e" } },
    ], { barmode: "relative", margin: { l: 50, r: 10, t: 10, b: 40 }, height: 300, legend: { orientation: "h", y: 1.12 },
         xaxis: { title: { text: "block" } }, yaxis: { title: { text: "direct logit attribution" } } },
       { ...PLOT_CONFIG, toImageButtonOptions: { ...PLOT_CONFIG.toImageButtonOptions, filename: "vocablens-attribution" } });
    $("attr-summary").textContent =
      `target ${vis(data.target)}${data.contrast !== null ? " vs " + vis(data.contrast) : ""}: ` +
      `model logit difference ${fmt(data.logit_diff_model)}, sum of the parts ${fmt(data.logit_diff_sum)} ` +
      `(embedding ${fmt(data.embed_dla)}). ${data.approximation}`;
    // the largest parts: attention heads and FFN sub-updates (neurons)
    const parts = [];
    data.blocks.forEach((b) => {
      b.head_dla.forEach((v, h) => parts.push({ what: `block ${b.block} head ${h}`, v, toks: [], ids: [] }));
      b.sub_updates.forEach((s) => parts.push({ what: `block ${b.block} FFN neuron ${s.neuron}`, v: s.dla, toks: s.top_tokens,
                                                ids: s.top_ids || [] }));
    });
    parts.sort((a, b) => Math.abs(b.v) - Math.abs(a.v));
    const t = $("attr-table");
    t.append(el("tr", {}, el("th", { class: "l", text: "part" }), el("th", { text: "attribution" }),
                el("th", { class: "l", text: "what it promotes" })));
    for (const p of parts.slice(0, 10)) {
      t.append(el("tr", {}, el("td", { class: "l", text: p.what }), el("td", { text: fmt(p.v) }),
                  el("td", { class: "l" }, tokList(p.toks, p.ids, 5))));
    }
  } catch (e) { if (seq === S.cellSeq) { $("attr-summary").textContent = ""; status(e.message, true); } }
}

async function loadNeighbors(id, box, onQuery = null, live = () => true) {
  // live(): whether the panel that asked is still on screen when the answer comes
  box.replaceChildren(el("span", { class: "dim", text: "…" }));
  try {
    const { data } = await api("/api/neighbors", { token: id, k: 10 });
    if (!live()) return;
    const q = data.queries[0];
    if (onQuery) onQuery(q);
    box.replaceChildren();
    for (const [m, label] of [["input", data.tied ? "embedding = LM head (tied)" : "input embedding"], ["output", "output (LM head)"]]) {
      if (!q[m]) continue;
      box.append(el("div", { class: "dim", text: label }),
                 el("div", { class: "toks" }, ...q[m].map((n) => {
                   const b = tokButton(n.token, n.id); b.title = `cosine ${fmt(n.cosine)}`; return b; })));
    }
  } catch (e) { if (live()) box.replaceChildren(el("span", { class: "dim", text: e.message })); }
}

// ------------------------------------------------------------------------------------------- token
function selectToken(id, text) {
  S.token = id;
  $("token-panel").hidden = false;
  const title = (t) => $("token-title").replaceChildren(`Token `, el("span", { class: "tok", text: vis(t) }), ` (id ${id})`);
  title(text === null ? "…" : text);
  writeURL();
  const seq = ++S.tokenSeq;
  const live = () => S.tokenSeq === seq;  // dropped once another token or prompt took the panel
  loadNeighbors(id, $("tok-neighbors"), text === null ? (q) => title(q.tokens[0]) : null, live);
  loadArgmax(id);
  loadUndertrained(id);
  loadProject(id);
  $("token-panel").scrollIntoView({ behavior: "smooth", block: "nearest" });
}

async function loadArgmax(id) {
  const box = $("tok-argmax");
  try {
    const { status: code, data } = await api("/api/argmax", { token: id });
    if (S.token !== id) return;
    if (code === 202) {
      const p = data.progress || {};
      const where = p.stage ? ` (stage ${p.stage}: ${p.done}/${p.total})` : "";
      box.replaceChildren(el("span", { class: "dim", text: `the scan of the whole vocabulary is still running${where}; this fills in when it is done…` }));
      setTimeout(() => { if (S.token === id) loadArgmax(id); }, 3000);
      return;
    }
    showScan("done");
    const rows = [el("p", {}, el("span", { class: `verdict ${data.verdict}`, text: data.verdict }),
                     ` (settled by stage ${data.stage ?? "–"}; margin ${fmt(data.margin, 4)})`)];
    if (data.norm) rows.push(el("p", { text: `under the final norm its probability can reach ${fmt(data.norm.p_lower, 4)}–${fmt(data.norm.p_upper, 4)}` }));
    if (data.reason) rows.push(el("p", { class: "dim", text: data.reason }));
    if (data.duplicates) rows.push(el("p", { class: "dim", text: `an exact duplicate of ${data.duplicates.tokens.map(vis).join(", ")}` }));
    const c = data.scan.counts;
    rows.push(el("p", { class: "dim", text: `whole vocabulary: ${c.argmaxable} argmaxable, ${c.unargmaxable} never win, ${c.undecided} undecided` }));
    box.replaceChildren(...rows);
  } catch (e) { box.replaceChildren(el("span", { class: "dim", text: e.message })); }
}

async function loadUndertrained(id) {
  // class and indicator always; the repeat probability when the server was given a verification
  const box = $("tok-undertrained");
  box.replaceChildren(el("span", { class: "dim", text: "…" }));
  try {
    const { data } = await api("/api/undertrained", { token: id });
    if (S.token !== id) return;
    S.last.undertrained = data;
    const ind = data.indicator;
    const word = data.verdict === "under-trained" ? "under-trained" : data.verdict === "trained" ? "trained" :
      !data.testable ? "not tested" : ind.candidate ? "candidate" : "not a candidate";
    const rows = [el("p", {}, el("span", { class: `verdict ut-${word.replace(/ /g, "-")}`, id: "ut-verdict", text: word }),
                     ` class ${data.class.replace(/_/g, " ")}`)];
    const where = ind.rank === null ? "" : `; rank ${ind.rank + 1} of ${ind.of} from the lowest` +
      (ind.candidate ? " (among the paper's lowest 2%)" : "");
    rows.push(el("p", { id: "ut-indicator", text: `indicator (${ind.name.replace(/_/g, " ")}): ${fmt(ind.value, 4)}${where}` }));
    if (data.verification) {
      rows.push(el("p", { id: "ut-prob", text: `highest repeat probability ${Number(data.verification.max_prob).toExponential(2)} (under-trained below 0.01)` }));
    } else if (data.testable) {
      rows.push(el("p", { class: "dim", text: data.verified_run ? "not among the verified candidates" :
        "not verified: start the server with --undertrained FILE (a saved `vocablens undertrained --json`)" }));
    }
    box.replaceChildren(...rows);
  } catch (e) { box.replaceChildren(el("span", { class: "dim", text: e.message })); }
}

async function loadProject(id) {
  const box = $("tok-project");
  box.replaceChildren(el("span", { class: "dim", text: "…" }));
  try {
    const { data } = await api("/api/project", { token: id, k: 5 });
    if (S.token !== id) return;
    S.last.project = data;
    const zTip = `z: the ranking key, the ${data.criterion}. Rows are sorted by it, strongest first ` +
                 "(promotes: largest z first; suppresses: most negative first).";
    const sTip = "logit per unit: the raw logit the vector adds to the token per unit of the neuron's activation";
    const head = [["", ""], ["block", "the block whose FFN holds the neuron"], ["neuron", "the neuron (row of the FFN's output matrix)"],
                  ["z ↓", zTip], ["logit / unit", sTip], ["it promotes", "the vector's top tokens (click one)"]];
    const t = el("table", { id: "project-table" }, el("tr", {}, ...head.map(([h, tip], i) =>
      el("th", { class: i === 3 || i === 4 ? "" : "l", text: h, title: tip }))));
    for (const [side, rows, sign] of [["promotes", data.promote, -1], ["suppresses", data.suppress, 1]]) {
      const sorted = [...rows].sort((a, b) => sign * (a.z - b.z) || a.block - b.block || a.neuron - b.neuron);
      sorted.forEach((r, i) => t.append(el("tr", { "data-side": side }, el("td", { class: "l dim", text: i === 0 ? side : "" }),
        el("td", { class: "l", text: String(r.block) }), el("td", { class: "l", text: String(r.neuron) }),
        el("td", { class: "z", text: fmt(r.z, 2) }), el("td", { text: fmt(r.score) }),
        el("td", { class: "l" }, tokList(r.top_tokens, r.top_ids, 6)))));
    }
    box.replaceChildren(t, el("p", { class: "dim", text: "z (hover the header): how strongly the vector singles this token " +
      "out among its own logits over the vocabulary; logit / unit: the raw logit it adds per unit of activation." }));
  } catch (e) { box.replaceChildren(el("span", { class: "dim", text: e.message })); }
}

// ------------------------------------------------------------------------------------ argmax scan
const SCAN_WORDS = { pending: "running…", done: "done", failed: "failed", off: "off (--no-argmax)" };
function showScan(state) {
  $("argmax-scan").textContent = `argmax scan: ${SCAN_WORDS[state] || state}`;
  $("argmax-scan").dataset.state = state;
  if (state === "pending" && !S.scanPoll) S.scanPoll = setTimeout(pollScan, 2000);
}
async function pollScan() {
  // the header follows the background scan until it ends (done, failed)
  S.scanPoll = null;
  try {
    const r = await fetch("/api/health");
    const h = await r.json();
    S.health.argmax = h.argmax;
    showScan(h.argmax);
  } catch (e) { S.scanPoll = setTimeout(pollScan, 5000); }
}

// -------------------------------------------------------------------------------------------- start
async function start() {
  const u = readURL();
  $("prompt").value = u.prompt; $("chat").checked = u.chat; S.view = u.view; S.metric = u.metric;
  document.querySelector(`input[name=view][value=${u.view}]`).checked = true;
  $("prompt-form").addEventListener("submit", (e) => { e.preventDefault(); run(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); run(); }
  });
  for (const r of document.querySelectorAll("input[name=view]")) {
    r.addEventListener("change", () => { S.view = r.value; writeURL(); drawHeatmap(); });
  }
  $("metric").value = S.metric;
  $("metric").addEventListener("change", () => { S.metric = $("metric").value; writeURL(); drawHeatmap(); });
  for (const kind of ["csv", "json", "png"]) $(`export-${kind}`).addEventListener("click", () => exportMap(kind));
  let resized = null;  // the map's width follows the window's (it is set in px: see drawHeatmap)
  window.addEventListener("resize", () => { clearTimeout(resized); resized = setTimeout(() => { if (S.data) drawHeatmap(); }, 200); });
  $("heatmap").addEventListener("keydown", (e) => {
    const moves = { ArrowUp: [1, 0], ArrowDown: [-1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    if (moves[e.key]) { e.preventDefault(); moveCursor(...moves[e.key]); }
    else if ((e.key === "Enter" || e.key === " ") && S.cursor) { e.preventDefault(); selectCell(S.cursor.layer, S.cursor.pos); }
  });
  try {
    const r = await fetch("/api/health");
    S.health = await r.json();
    const pv = S.health.provenance;
    $("model").textContent = `${pv.name}${pv.quantization ? " (" + pv.quantization + ")" : ""} · ${S.health.n_layers} blocks · ` +
      `d=${S.health.d_model} · V=${S.health.vocab_size}` +
      (S.health.tuned === "loaded" ? " · tuned lens loaded" : " · no tuned lens");
    if (S.health.tuned !== "loaded") for (const v of ["tuned", "diff"]) document.querySelector(`input[name=view][value=${v}]`).disabled = true;
    if (S.health.jacobian !== "loaded") document.querySelector("input[name=view][value=jacobian]").disabled = true;
    showScan(S.health.argmax);
    $("bos-note").hidden = S.health.adds_bos !== false;
  } catch (e) { status("cannot reach the server: " + e.message, true); return; }
  if (u.prompt) {
    await run();
    if (u.cell && S.data) {
      const base = lensOf("logit");
      if (u.cell.layer < base.layers.length && u.cell.pos < base.tokens.length) selectCell(u.cell.layer, u.cell.pos);
    }
  } else {
    $("prompt").focus();
  }
  if (u.token !== null) selectToken(u.token, null);
}

start();
