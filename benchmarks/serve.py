"""Benchmark of ``vocablens serve`` on the default model, end to end over HTTP on 127.0.0.1.

Measures, against the issue's targets:
  1. ``/api/lens`` on a 32-token prompt, both lenses, every layer and position, k=5: median wall
     seconds over ``--reps`` new prompts (no cache hit) -- target <= 1.5 s;
  2. a click (the page's trajectory + explain requests for one cell) -- target <= 1.0 s;
  3. the page's first contentful paint after the server is up (headless chromium when installed,
     else the time to fetch the page and its assets) -- target <= 1 s;
  4. a second click on the same prompt runs no forward pass (the server's ``forward_passes`` counter).

The machine may be shared: beside each wall time it prints the server process's CPU seconds for the
request (user + system, all threads; read from /proc), the contention-free figure. The server runs
with --no-argmax so that the background argmax scan does not compete with the requests measured.

Usage: PYTHONPATH=src python benchmarks/serve.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
WORDS = ("the old man walked along the river with his dog and saw a small boat near the bridge while "
         "children played in the park under a bright blue sky on a warm summer day in early June").split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def get(url: str, path: str) -> bytes:
    with urllib.request.urlopen(url + path, timeout=900) as r:
        return r.read()


def timed(pid: int, fn):
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, cpu_seconds(pid) - c0


def prompt_32(i: int) -> str:
    w = WORDS[i % len(WORDS):] + WORDS[: i % len(WORDS)]
    return " ".join(w[:32]).capitalize()


def first_paint(url: str) -> tuple[str, float]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            chromium = None
    if not chromium:
        t0 = time.perf_counter()
        for path in ("/", "/static/style.css", "/static/plotly.min.js", "/static/app.js"):
            get(url, path)
        return "page + assets fetched (no chromium)", time.perf_counter() - t0
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = b.new_page(viewport={"width": 1000, "height": 900})
        page.goto(url + "/", wait_until="load")
        fcp = page.evaluate("() => (performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime")
        b.close()
    return "first contentful paint (chromium)", (fcp or float("nan")) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="new 32-token prompts timed (median reported)")
    args = ap.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=SRC)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "vocablens", "serve", "--port", str(port), "--no-argmax"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                health = json.loads(get(url, "/api/health"))
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit("the server exited")
                time.sleep(0.2)
        startup = time.perf_counter() - t0
        how, paint = first_paint(url)
        print(f"model {health['model']}; server up in {startup:.1f} s; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"page: {how} {paint:.3f} s after the server was up (target <= 1 s)")

        rows = []
        for i in range(args.reps):
            p = prompt_32(i)
            d, wall, cpu = timed(proc.pid, lambda: post(url, "/api/lens", {"prompt": p, "kind": "both", "k": 5}))
            T = len(d["logit"]["tokens"])
            rows.append((wall, cpu))
            print(f"  /api/lens both k=5, {T} tokens x {d['logit']['n_layers'] + 1} layers: "
                  f"{wall:.3f} s wall, {cpu:.3f} s server CPU")
        lens_wall = statistics.median(r[0] for r in rows)
        lens_cpu = statistics.median(r[1] for r in rows)

        p = prompt_32(0)
        lens = post(url, "/api/lens", {"prompt": p, "kind": "both", "k": 5})  # cached
        clicks = []
        for pos in (31, 20, 10):
            tok = lens["logit"]["layers"][-1]["positions"][pos]["top_ids"][0]

            def click():
                a = post(url, "/api/trajectory", {"prompt": p, "position": pos, "token": tok})
                b = post(url, "/api/explain", {"prompt": p, "position": pos, "target": tok})
                return a, b

            n0 = json.loads(get(url, "/api/health"))["forward_passes"]
            _, wall, cpu = timed(proc.pid, click)
            n1 = json.loads(get(url, "/api/health"))["forward_passes"]
            _, wall2, cpu2 = timed(proc.pid, click)
            n2 = json.loads(get(url, "/api/health"))["forward_passes"]
            clicks.append((wall, cpu))
            print(f"  click position {pos} (trajectory + explain): {wall:.3f} s wall, {cpu:.3f} s server CPU, "
                  f"{n1 - n0} forward pass(es); the same click again: {wall2:.3f} s, {n2 - n1} forward passes")
        click_wall = statistics.median(c[0] for c in clicks)
        click_cpu = statistics.median(c[1] for c in clicks)
        n0 = json.loads(get(url, "/api/health"))["forward_passes"]
        for pos in range(32):
            post(url, "/api/trajectory", {"prompt": p, "position": pos, "token": 264})
        traj_passes = json.loads(get(url, "/api/health"))["forward_passes"] - n0

        print()
        print(f"lens (32 tokens, both lenses, k=5): median {lens_wall:.3f} s wall "
              f"(target 1.5 s: ratio {lens_wall / 1.5:.2f}), {lens_cpu:.3f} s server CPU")
        print(f"click (trajectory + explain, new cell): median {click_wall:.3f} s wall "
              f"(target 1.0 s: ratio {click_wall / 1.0:.2f}), {click_cpu:.3f} s server CPU")
        print(f"first paint: {paint:.3f} s (target 1 s: ratio {paint:.2f})")
        print(f"trajectories of all 32 positions of a prompt already read: {traj_passes} forward passes")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
