"""What a reader sees of a plotly figure's word labels in Chromium: the label boxes and the points.

``LABELS_JS`` (run with ``page.evaluate(LABELS_JS, div_id)``) returns every annotation's text and its
box, and every visible point's hover text and pixel centre, both relative to the figure's div. A 3-D
scene's points are projected with the scene's own camera matrices (the matrices plotly.js draws the
WebGL points with, and projects its 3-D annotations with); a 2-D figure's points are its SVG markers.
"""

LABELS_JS = """(id) => {
  const gd = document.getElementById(id), L = gd._fullLayout, own = gd.getBoundingClientRect();
  const labels = [...gd.querySelectorAll('g.annotation, g.annotation-scene')].map((g) => {
    const r = g.querySelector('.annotation-text-g').getBoundingClientRect();
    return {text: g.querySelector('text').textContent,
            box: [r.left - own.left, r.top - own.top, r.right - own.left, r.bottom - own.top]}; });
  const points = [];
  if (L.scene) {
    const s = L.scene, sc = s._scene, cp = sc.glplot.cameraParams, d = sc.dataScale;
    const mul = (m, v) => { const r = [0, 0, 0, 0];
      for (let i = 0; i < 4; ++i) for (let j = 0; j < 4; ++j) r[j] += m[4 * i + j] * v[i]; return r; };
    const W = L._size.w * (s.domain.x[1] - s.domain.x[0]), H = L._size.h * (s.domain.y[1] - s.domain.y[0]);
    const x0 = L._size.l + s.domain.x[0] * L._size.w, y0 = L._size.t + (1 - s.domain.y[1]) * L._size.h;
    for (const t of gd._fullData) {
      if (t.visible !== true) continue;
      for (let k = 0; k < t.x.length; ++k) {
        const p = mul(cp.projection, mul(cp.view, mul(cp.model, [t.x[k] * d[0], t.y[k] * d[1], t.z[k] * d[2], 1])));
        points.push({text: t.hovertext[k], xy: [x0 + 0.5 * (1 + p[0] / p[3]) * W, y0 + 0.5 * (1 - p[1] / p[3]) * H]});
      } }
  } else {
    for (const g of gd.querySelectorAll('.scatterlayer .trace')) {
      const t = g.__data__[0].trace;
      [...g.querySelectorAll('.point')].forEach((e, k) => { const r = e.getBoundingClientRect();
        points.push({text: t.hovertext[k], xy: [(r.left + r.right) / 2 - own.left, (r.top + r.bottom) / 2 - own.top]}); });
    }
  }
  return {labels, points};
}"""


def label_problems(seen: dict, reach: float = 2.0) -> list[tuple[str, str, str]]:
    """("overlap", a, b) for two labels whose boxes overlap, ("covers", label, word) for a label box
    that comes within ``reach`` pixels of a point's centre (it hides that point)."""
    out = []
    labels = seen["labels"]
    for i, a in enumerate(labels):
        A = a["box"]
        for b in labels[i + 1:]:
            B = b["box"]
            if A[0] < B[2] and B[0] < A[2] and A[1] < B[3] and B[1] < A[3]:
                out.append(("overlap", a["text"], b["text"]))
        for p in seen["points"]:
            x, y = p["xy"]
            if A[0] - reach < x < A[2] + reach and A[1] - reach < y < A[3] + reach:
                out.append(("covers", a["text"], p["text"]))
    return out
