// vocablens serve: the page. Vanilla JS + plotly.js (served by the same server). No build step.
// Every number comes from the JSON API (/openapi.json); tokens are shown with visible whitespace.
"use strict";

const $ = (id) => document.getElementById(id);
const S = { prompt: "", chat: false, view: "logit", cell: null, token: null, data: null, health: null,
            cursor: null, seq: 0 };
window.vl = S;  // for the tests and the curious: the state and the last answers (S.last)
S.last = {};

// ------------------------------------------------------------------------------------------ helpers
function vis(t) {
  // token_str escapes control characters as \n, \t, \r; show them and spaces visibly
  return String(t).replace(/ /g, "␣").replace(/\\n/g, "⏎").replace(/\\t/g, "⇥").replace(/\\r/g, "␍");
}
function short(t, n) { t = vis(t); return t.length > n ? t.slice(0, n - 1) + "…" : t; }
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

// ---------------------------------------------------------------------------------------------- URL
function writeURL() {
  const q = new URLSearchParams();
  if (S.prompt) q.set("prompt", S.prompt);
  if (S.chat) q.set("chat", "1");
  if (S.view !== "logit") q.set("view", S.view);
  if (S.cell) q.set("cell", `${S.cell.layer},${S.cell.pos}`);
  if (S.token !== null) q.set("token", String(S.token));
  history.replaceState(null, "", "?" + q.toString());
}
function readURL() {
  const q = new URLSearchParams(location.search);
  const cell = (q.get("cell") || "").split(",").map(Number);
  return { prompt: q.get("prompt") || "", chat: q.get("chat") === "1",
           view: ["logit", "tuned", "diff"].includes(q.get("view")) ? q.get("view") : "logit",
           cell: cell.length === 2 && cell.every(Number.isInteger) ? { layer: cell[0], pos: cell[1] } : null,
           token: /^\d+$/.test(q.get("token") || "") ? Number(q.get("token")) : null };
}

// ------------------------------------------------------------------------------------------ heatmap
function lensOf(name) {
  const d = S.data;
  if (!d) return null;
  return d.kind === "both" ? d[name] : (d.kind === name ? d : null);
}
function cellOf(name, layer, pos) {
  const d = lensOf(name);
  return d ? d.layers[layer].positions[pos] : null;
}

function heatmapTraces() {
  const lo = lensOf("logit"), tu = lensOf("tuned");
  const base = S.view === "tuned" && tu ? tu : lo;
  const L = base.layers.length, T = base.tokens.length;
  const z = [], text = [], hover = [];
  for (let l = 0; l < L; l++) {
    const zr = [], tr = [], hr = [];
    for (let p = 0; p < T; p++) {
      const c = base.layers[l].positions[p];
      if (S.view === "diff" && tu) {
        const a = lo.layers[l].positions[p], b = tu.layers[l].positions[p];
        zr.push(b.final_top1_prob - a.final_top1_prob);
        tr.push(short(b.top_tokens[0], 6));
        hr.push(`layer ${l}, position ${p}<br>logit top-1 ${vis(a.top_tokens[0])} (${fmt(a.top_probs[0])})` +
                `<br>tuned top-1 ${vis(b.top_tokens[0])} (${fmt(b.top_probs[0])})` +
                `<br>p(final top-1): tuned − logit = ${fmt(b.final_top1_prob - a.final_top1_prob)}`);
      } else {
        zr.push(c.top_probs[0]);
        tr.push(short(c.top_tokens[0], 6));
        hr.push(`layer ${l}, position ${p} (${vis(base.tokens[p])})<br>top-1 ${vis(c.top_tokens[0])} ` +
                `p=${fmt(c.top_probs[0])}<br>entropy ${fmt(c.entropy, 2)} nats`);
      }
    }
    z.push(zr); text.push(tr); hover.push(hr);
  }
  const diff = S.view === "diff";
  return [{ type: "heatmap", z, text, customdata: hover, x: [...Array(T).keys()], y: [...Array(L).keys()],
            texttemplate: "%{text}", textfont: { size: T > 24 ? 8 : 10 }, hovertemplate: "%{customdata}<extra></extra>",
            colorscale: diff ? "RdBu" : "Viridis", zmin: diff ? -1 : 0, zmax: 1, zmid: diff ? 0 : undefined,
            xgap: 1, ygap: 1,
            colorbar: { title: { text: diff ? "Δp final top-1<br>(tuned − logit)" : "p(top-1)", side: "right" },
                        thickness: 12 } }];
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
  const T = base.tokens.length, L = base.layers.length;
  const layout = {
    margin: { l: 48, r: 10, t: 10, b: 90 }, height: Math.max(320, 16 * L + 110),
    xaxis: { tickmode: "array", tickvals: [...Array(T).keys()], ticktext: base.tokens.map((t) => short(t, 10)),
             tickangle: -45, title: { text: "position (input token)" }, fixedrange: true },
    yaxis: { title: { text: "layer" }, fixedrange: true, dtick: 5 },
    shapes: cursorShape(),
  };
  Plotly.react("heatmap", heatmapTraces(), layout, { displayModeBar: false, responsive: true });
  const gd = $("heatmap");
  if (!gd._vlBound) {
    gd._vlBound = true;
    gd.on("plotly_click", (ev) => { const p = ev.points[0]; selectCell(p.y, p.x); });
  }
}

function moveCursor(dl, dp) {
  const base = lensOf("logit") || lensOf("tuned");
  if (!base) return;
  const L = base.layers.length, T = base.tokens.length;
  const c = S.cursor || { layer: L - 1, pos: T - 1 };
  S.cursor = { layer: Math.min(L - 1, Math.max(0, c.layer + dl)), pos: Math.min(T - 1, Math.max(0, c.pos + dp)) };
  Plotly.relayout("heatmap", { shapes: cursorShape() });
}

// -------------------------------------------------------------------------------------------- lens
async function run() {
  const prompt = $("prompt").value;
  if (!prompt.trim()) { status("Type a prompt first.", true); return; }
  S.prompt = prompt; S.chat = $("chat").checked;
  const seq = ++S.seq;
  status("Reading every layer and position…");
  const kind = S.health && S.health.tuned === "loaded" ? "both" : "logit";
  const t0 = performance.now();
  try {
    const { data } = await api("/api/lens", { prompt: S.prompt, kind, k: 5, chat: S.chat });
    if (seq !== S.seq) return;
    S.data = data; S.last.lens = data;
    const base = lensOf("logit");
    S.cursor = { layer: base.layers.length - 1, pos: base.tokens.length - 1 };
    drawHeatmap();
    status(`${base.tokens.length} tokens × ${base.layers.length} layers in ${((performance.now() - t0) / 1000).toFixed(2)} s` +
           (kind === "logit" ? " (no tuned lens for this model)" : ""));
    writeURL();
  } catch (e) { status(e.message, true); }
}

// -------------------------------------------------------------------------------------------- cell
function selectCell(layer, pos) {
  if (!S.data) return;
  S.cell = { layer, pos }; S.cursor = { layer, pos };
  Plotly.relayout("heatmap", { shapes: cursorShape() });
  const name = S.view === "tuned" && lensOf("tuned") ? "tuned" : "logit";
  const c = cellOf(name, layer, pos);
  const tok = { id: c.top_ids[0], text: c.top_tokens[0] };
  const base = lensOf(name);
  $("cell-panel").hidden = false;
  $("cell-title").textContent = `Layer ${layer}, position ${pos} (after ${vis(base.tokens[pos])}): ${name} lens top-1 ${vis(tok.text)}`;
  for (const id of ["cell-token", "traj-token", "attr-token"]) $(id).replaceChildren(tokButton(tok.text, tok.id));
  drawTopk(layer, pos);
  writeURL();
  loadTrajectory(pos, tok);
  loadExplain(pos, tok);
  loadNeighbors(tok.id, $("cell-neighbors-body"));
}

function drawTopk(layer, pos) {
  const body = $("topk-body");
  body.replaceChildren();
  for (const name of ["logit", "tuned"]) {
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
  const seq = S.seq;
  $("traj-table").replaceChildren();
  try {
    const { data } = await api("/api/trajectory", { prompt: S.prompt, chat: S.chat, position: pos, token: tok.id });
    if (seq !== S.seq) return;
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
    }, { displayModeBar: false, responsive: true });
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

async function loadExplain(pos, tok) {
  const seq = S.seq;
  $("attr-table").replaceChildren();
  $("attr-summary").textContent = "computing…";
  try {
    const { data } = await api("/api/explain", { prompt: S.prompt, chat: S.chat, position: pos, target: tok.id });
    if (seq !== S.seq) return;
    S.last.explain = data;
    const blocks = data.blocks.map((b) => b.block);
    Plotly.react("attr-plot", [
      { type: "bar", x: blocks, y: data.blocks.map((b) => b.attn_dla), name: "attention", marker: { color: "#0b5cad" } },
      { type: "bar", x: blocks, y: data.blocks.map((b) => b.mlp_dla), name: "FFN", marker: { color: "#e4572e" } },
    ], { barmode: "relative", margin: { l: 50, r: 10, t: 10, b: 40 }, height: 300, legend: { orientation: "h", y: 1.12 },
         xaxis: { title: { text: "block" } }, yaxis: { title: { text: "direct logit attribution" } } },
       { displayModeBar: false, responsive: true });
    $("attr-summary").textContent =
      `target ${vis(data.target)}${data.contrast !== null ? " vs " + vis(data.contrast) : ""}: ` +
      `model logit difference ${fmt(data.logit_diff_model)}, sum of the parts ${fmt(data.logit_diff_sum)} ` +
      `(embedding ${fmt(data.embed_dla)}). ${data.approximation}`;
    // the largest parts: attention heads and FFN sub-updates (neurons)
    const parts = [];
    data.blocks.forEach((b) => {
      b.head_dla.forEach((v, h) => parts.push({ what: `block ${b.block} head ${h}`, v, toks: [] }));
      b.sub_updates.forEach((s) => parts.push({ what: `block ${b.block} FFN neuron ${s.neuron}`, v: s.dla, toks: s.top_tokens }));
    });
    parts.sort((a, b) => Math.abs(b.v) - Math.abs(a.v));
    const t = $("attr-table");
    t.append(el("tr", {}, el("th", { class: "l", text: "part" }), el("th", { text: "attribution" }),
                el("th", { class: "l", text: "what it promotes" })));
    for (const p of parts.slice(0, 10)) {
      t.append(el("tr", {}, el("td", { class: "l", text: p.what }), el("td", { text: fmt(p.v) }),
                  el("td", { class: "l" }, el("span", { class: "toks" }, ...p.toks.slice(0, 5).map((x) => el("span", { class: "tok", text: vis(x) }))))));
    }
  } catch (e) { $("attr-summary").textContent = ""; status(e.message, true); }
}

async function loadNeighbors(id, box, onQuery = null) {
  box.replaceChildren(el("span", { class: "dim", text: "…" }));
  try {
    const { data } = await api("/api/neighbors", { token: id, k: 10 });
    const q = data.queries[0];
    if (onQuery) onQuery(q);
    box.replaceChildren();
    for (const [m, label] of [["input", data.tied ? "embedding = LM head (tied)" : "input embedding"], ["output", "output (LM head)"]]) {
      if (!q[m]) continue;
      box.append(el("div", { class: "dim", text: label }),
                 el("div", { class: "toks" }, ...q[m].map((n) => {
                   const b = tokButton(n.token, n.id); b.title = `cosine ${fmt(n.cosine)}`; return b; })));
    }
  } catch (e) { box.replaceChildren(el("span", { class: "dim", text: e.message })); }
}

// ------------------------------------------------------------------------------------------- token
function selectToken(id, text) {
  S.token = id;
  $("token-panel").hidden = false;
  const title = (t) => $("token-title").replaceChildren(`Token `, el("span", { class: "tok", text: vis(t) }), ` (id ${id})`);
  title(text === null ? "…" : text);
  writeURL();
  loadNeighbors(id, $("tok-neighbors"), text === null ? (q) => title(q.tokens[0]) : null);
  loadArgmax(id);
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

async function loadProject(id) {
  const box = $("tok-project");
  box.replaceChildren(el("span", { class: "dim", text: "…" }));
  try {
    const { data } = await api("/api/project", { token: id, k: 5 });
    const t = el("table", {}, el("tr", {}, ...["", "block", "neuron", "score", "it promotes"].map((h) => el("th", { class: "l", text: h }))));
    for (const [side, rows] of [["promotes", data.promote], ["suppresses", data.suppress]]) {
      rows.forEach((r, i) => t.append(el("tr", {}, el("td", { class: "l dim", text: i === 0 ? side : "" }),
        el("td", { text: String(r.block) }), el("td", { text: String(r.neuron) }), el("td", { text: fmt(r.score) }),
        el("td", { class: "l" }, el("span", { class: "toks" }, ...(r.top_tokens || []).slice(0, 6).map((x) => el("span", { class: "tok", text: vis(x) })))))));
    }
    box.replaceChildren(t);
  } catch (e) { box.replaceChildren(el("span", { class: "dim", text: e.message })); }
}

// -------------------------------------------------------------------------------------------- start
async function start() {
  const u = readURL();
  $("prompt").value = u.prompt; $("chat").checked = u.chat; S.view = u.view;
  document.querySelector(`input[name=view][value=${u.view}]`).checked = true;
  $("prompt-form").addEventListener("submit", (e) => { e.preventDefault(); run(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); run(); }
  });
  for (const r of document.querySelectorAll("input[name=view]")) {
    r.addEventListener("change", () => { S.view = r.value; writeURL(); drawHeatmap(); });
  }
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
    $("argmax-scan").textContent = `argmax scan: ${S.health.argmax}`;
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
