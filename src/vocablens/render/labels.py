"""Label placement for scatter figures: where each word's label goes so that no two labels overlap.

Screen-space, greedy: each label takes the first free spot among candidate offsets around its point
(beside it first, then on rings further out, joined to the point by a leader line), where a spot is
free when its box stays inside the plot, overlaps no label already placed and covers no point. The
densest points are placed first, so they get the spots nearest to them. This is the layout rule
of map labelling (point-feature label placement: Christensen, Marks & Shieber, "An empirical study
of algorithms for point-feature label placement", ACM TOG 14(3), 1995, the greedy baseline), kept
simple: a figure of ~60 words needs no annealing.

``project_scene`` maps 3-D data to the pixels plotly.js draws them at for a given camera, so that the
labels of a 3-D scene are placed for the view a reader opens the figure with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: width of one character as a fraction of the font size: wider than the average glyph of the
#: sans-serif fonts plotly falls back to (Open Sans, DejaVu Sans, Arial), so a box is never too small
CHAR_WIDTH = 0.64
#: a label box's height as a fraction of the font size (ascent + descent)
LINE_HEIGHT = 1.3


@dataclass(frozen=True)
class Placed:
    """Where one label went, in pixels relative to its point (x right, y down).

    Attributes:
        dx, dy: offset of the label box's centre from the point.
        leader: whether the label sits away from its point (drawn with a leader line).
        box: (x0, y0, x1, y1) of the label in plot pixels.
    """

    dx: float
    dy: float
    leader: bool
    box: tuple[float, float, float, float]


def text_size(text: str, font_px: float) -> tuple[float, float]:
    """An upper estimate of a one-line label's (width, height) in pixels at ``font_px``."""
    return len(text) * CHAR_WIDTH * font_px + 4.0, LINE_HEIGHT * font_px


def _overlap(a, b, gap: float = 0.0) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def _covers(box, x: float, y: float, r: float) -> bool:
    """Whether a box comes within ``r`` pixels of the point (x, y)."""
    cx, cy = min(max(x, box[0]), box[2]), min(max(y, box[1]), box[3])
    return (cx - x) ** 2 + (cy - y) ** 2 < r * r


def _rings(w: float, h: float, r: float, max_leader: float) -> list[list[tuple[float, float, bool]]]:
    """Offsets (dx, dy, leader) of a w x h box's centre, in rings: beside the point, then ever further."""
    near = r + 2.0
    rings = [[(near + w / 2, 0, False), (-near - w / 2, 0, False), (0, -near - h / 2, False), (0, near + h / 2, False),
              (near + w / 2, -near - h / 2, False), (-near - w / 2, -near - h / 2, False),
              (near + w / 2, near + h / 2, False), (-near - w / 2, near + h / 2, False)]]
    ring = near + h
    while ring <= max_leader:
        n = max(12, int(2 * math.pi * ring / (h * 1.5)))
        out = []
        for k in range(n):
            a = 2 * math.pi * k / n
            # the box's edge, not its centre, at distance ``ring`` along the direction
            dx, dy = math.cos(a), math.sin(a)
            reach = min(abs((w / 2) / dx) if dx else math.inf, abs((h / 2) / dy) if dy else math.inf)
            out.append(((ring + reach) * dx, (ring + reach) * dy, True))
        rings.append(out)
        ring += h
    return rings


def place_labels(xy: list[tuple[float, float]], sizes: list[tuple[float, float]], width: float, height: float,
                 point_px: float = 5.0, max_leader: float = 120.0) -> list[Placed | None]:
    """Non-overlapping spots for labels of points on a plot of ``width`` x ``height`` pixels.

    Ring by ring (beside the point, then ever further out), each label still unplaced takes the first
    free spot of the ring, the most crowded points first. A spot is free when its box stays inside the
    plot, keeps 1 px from every label placed, covers no point, and its leader line (point to label)
    passes through no label; leaders that cross no other leader are preferred (a second sweep of the
    rings allows crossings).

    Args:
        xy: n points in plot pixels (x right, y down).
        sizes: n label (width, height) in pixels, e.g. from :func:`text_size`.
        width, height: the plot area; every box stays inside it.
        point_px: a point's radius: no label comes this close to any point.
        max_leader: the farthest a label's edge may sit from its point, in pixels.

    Returns:
        n entries, each a :class:`Placed` or ``None`` where no free spot was found within
        ``max_leader`` (that word is left to the hover text).
    """
    n = len(xy)

    def crowd(i):  # neighbours within 2.5 label heights: the crowded choose first
        x, y = xy[i]
        return -sum(1 for j in range(n) if (xy[j][0] - x) ** 2 + (xy[j][1] - y) ** 2 < (2.5 * sizes[i][1]) ** 2)

    order = sorted(range(n), key=lambda i: (crowd(i), i))
    rings = [_rings(w, h, point_px, max_leader) for w, h in sizes]
    out: list[Placed | None] = [None] * n
    boxes: list[tuple[float, float, float, float]] = []
    leaders: list[tuple[float, float, float, float]] = []

    def free(i, dx, dy, leader, strict):
        (x, y), (w, h) = xy[i], sizes[i]
        box = (x + dx - w / 2, y + dy - h / 2, x + dx + w / 2, y + dy + h / 2)
        if box[0] < 0 or box[1] < 0 or box[2] > width or box[3] > height:
            return None
        if any(_overlap(box, b, 1.0) for b in boxes) or any(_covers(box, px, py, point_px) for px, py in xy):
            return None
        seg = (x, y, x + dx, y + dy)
        if strict:  # leaders cross no leader and strike through no label
            if leader and any(_crosses_box(seg, b) for b in boxes):
                return None
            if leader and any(_crosses(seg, s) for s in leaders) or any(_crosses_box(s, box) for s in leaders):
                return None
        return box

    for i in order:  # the nearest free spot: one its leader keeps clear in, else any
        for strict in (True, False):
            spot = next(((dx, dy, leader, box) for ring in rings[i] for dx, dy, leader in ring
                         if (box := free(i, dx, dy, leader, strict)) is not None), None)
            if spot is not None:
                dx, dy, leader, box = spot
                out[i] = Placed(dx, dy, leader, box)
                boxes.append(box)
                if leader:
                    leaders.append((xy[i][0], xy[i][1], xy[i][0] + dx, xy[i][1] + dy))
                break
    return out


def _crosses(a, b) -> bool:
    """Whether segments a and b, each (x0, y0, x1, y1), cross."""
    def side(p, q, r):
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])
    p1, p2, q1, q2 = a[:2], a[2:], b[:2], b[2:]
    return side(p1, p2, q1) * side(p1, p2, q2) < 0 and side(q1, q2, p1) * side(q1, q2, p2) < 0


def _crosses_box(seg, box) -> bool:
    """Whether a segment passes through a box (clipped against it, Liang-Barsky)."""
    x0, y0, x1, y1 = seg
    t0, t1 = 0.0, 1.0
    for p, q in ((x0 - x1, x0 - box[0]), (x1 - x0, box[2] - x0), (y0 - y1, y0 - box[1]), (y1 - y0, box[3] - y0)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return True


def _look_at(eye, center, up):
    f = [c - e for c, e in zip(center, eye)]
    fn = math.sqrt(sum(v * v for v in f))
    f = [v / fn for v in f]
    s = [f[1] * up[2] - f[2] * up[1], f[2] * up[0] - f[0] * up[2], f[0] * up[1] - f[1] * up[0]]
    sn = math.sqrt(sum(v * v for v in s))
    s = [v / sn for v in s]
    u = [s[1] * f[2] - s[2] * f[1], s[2] * f[0] - s[0] * f[2], s[0] * f[1] - s[1] * f[0]]
    return s, u, f


def project_scene(points, ranges, camera: dict, width: float, height: float,
                  aspect=(1.0, 1.0, 1.0), fovy: float = math.pi / 4) -> list[tuple[float, float]]:
    """Pixels at which plotly.js draws 3-D points in a scene of ``width`` x ``height`` pixels.

    plotly.js (gl3d) scales each axis range to a length ``aspect[i]`` centred on 0, looks from
    ``camera["eye"]`` at ``camera["center"]`` with ``camera["up"]`` (the layout's camera, in those
    scaled units) through a perspective of vertical field of view π/4, and maps clip space to the
    scene's pixels.

    Args:
        points: n (x, y, z) in data units.
        ranges: the three axis ranges ((lo, hi) per axis) the scene shows.
        camera: ``{"eye": (x, y, z), "center": (x, y, z), "up": (x, y, z)}``.
        width, height: the scene's size in pixels.

    Returns:
        n (x, y) pixels from the scene's top-left corner (y down).
    """
    eye, center, up = camera["eye"], camera["center"], camera.get("up", (0.0, 0.0, 1.0))
    s, u, f = _look_at(eye, center, up)
    t = 1.0 / math.tan(fovy / 2)
    ratio = width / height
    out = []
    for p in points:
        m = [aspect[i] * ((p[i] - ranges[i][0]) / (ranges[i][1] - ranges[i][0]) - 0.5) for i in range(3)]
        d = [m[i] - eye[i] for i in range(3)]
        xs, ys, zs = (sum(a * b for a, b in zip(s, d)), sum(a * b for a, b in zip(u, d)),
                      sum(a * b for a, b in zip(f, d)))
        ndc_x, ndc_y = t / ratio * xs / zs, t * ys / zs
        out.append(((1 + ndc_x) / 2 * width, (1 - ndc_y) / 2 * height))
    return out


__all__ = ["CHAR_WIDTH", "LINE_HEIGHT", "Placed", "place_labels", "project_scene", "text_size"]
