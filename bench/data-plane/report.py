#!/usr/bin/env python3
"""Renders a data-plane benchmark run (the JSON that bench/data-plane/run writes) as the report's
generated part (Markdown tables) and an SVG plot.

    bench/data-plane/report.py RUN.json OUT        # writes OUT.md (keeping its hand-written analysis) and OUT.svg
"""
import json, os, statistics, sys

run_file, out = sys.argv[1:]
run = json.load(open(run_file))
meta, raw = run["meta"], run["samples"]
secs, conns, workers, idle, size, rate, reps, date = (meta["seconds_per_measure"], meta["latency_connections"],
    meta["connrate_workers"], meta["idle_connections"], meta["request_size"], meta["open_loop_rate"],
    meta["repetitions"], meta["date"])
load_before, load_after, hap_v = meta["loadavg_before"], meta["loadavg_after"], meta["haproxy"]
def samples(target, metric, get=lambda v: v):
    return [get(r["value"]) for r in raw if r["target"] == target and r["metric"] == metric]

def med(target, metric, get=lambda v: v):
    vals = samples(target, metric, get)
    return statistics.median(vals) if vals else None

SPREAD = {}  # label -> target -> (min, max), filled by spread()
def spread(label, target, metric, get=lambda v: v, scale=1.0):
    vals = [v * scale for v in samples(target, metric, get)]
    if vals:
        SPREAD.setdefault(label, {})[target] = (min(vals), max(vals))

rows = [  # label, value of a target, format, higher is better
    ("throughput, 1 stream (Gbit/s)", lambda t: med(t, "tput1") / 1e9, "{:.2f}", True),
    ("throughput, 8 streams (Gbit/s)", lambda t: med(t, "tput8") / 1e9, "{:.2f}", True),
    (f"latency p50, {conns} conns at {float(rate):.0f} req/s (µs)", lambda t: med(t, "latency_open", lambda v: v["p50_us"]), "{:.0f}", False),
    (f"latency p99, {conns} conns at {float(rate):.0f} req/s (µs)", lambda t: med(t, "latency_open", lambda v: v["p99_us"]), "{:.0f}", False),
    (f"latency p50, {conns} conns flat out (µs)", lambda t: med(t, "latency_closed", lambda v: v["p50_us"]), "{:.0f}", False),
    (f"latency p99, {conns} conns flat out (µs)", lambda t: med(t, "latency_closed", lambda v: v["p99_us"]), "{:.0f}", False),
    (f"requests/s, {conns} conns flat out", lambda t: med(t, "latency_closed", lambda v: v["rps"]), "{:.0f}", True),
    ("new connections/s", lambda t: med(t, "connrate", lambda v: v["per_second"]), "{:.0f}", True),
    ("RSS per 10,000 idle connections (MiB)", lambda t: None if med(t, "idle_kib_per_10k") is None else med(t, "idle_kib_per_10k") / 1024, "{:.1f}", False),
]
def cpu_per(target, metric, work):
    """Median over repetitions of the proxy's CPU ms per unit of work (work: value -> units)."""
    vals = [r["cpu_ms"] / work(r["value"]) for r in raw
            if r["target"] == target and r["metric"] == metric and r.get("cpu_ms") is not None and work(r["value"])]
    return statistics.median(vals) if vals else None
secs_f = float(secs)
cpu_rows = [
    ("proxy CPU per GB relayed, 1 stream (ms)", lambda t: cpu_per(t, "tput1", lambda v: v * secs_f / 8 / 1e9), "{:.0f}"),
    ("proxy CPU per GB relayed, 8 streams (ms)", lambda t: cpu_per(t, "tput8", lambda v: v * secs_f / 8 / 1e9), "{:.0f}"),
    ("proxy CPU per 1,000 requests, flat out (ms)", lambda t: cpu_per(t, "latency_closed", lambda v: v["total_requests"] / 1000), "{:.1f}"),
    ("proxy CPU per 1,000 new connections (ms)", lambda t: cpu_per(t, "connrate", lambda v: v["connections"] / 1000), "{:.1f}"),
]
def fmt(f, v): return "–" if v is None else f.format(v)
spread_of = {
    rows[0][0]: ("tput1", lambda v: v, 1e-9), rows[1][0]: ("tput8", lambda v: v, 1e-9),
    rows[2][0]: ("latency_open", lambda v: v["p50_us"], 1), rows[3][0]: ("latency_open", lambda v: v["p99_us"], 1),
    rows[4][0]: ("latency_closed", lambda v: v["p50_us"], 1), rows[5][0]: ("latency_closed", lambda v: v["p99_us"], 1),
    rows[6][0]: ("latency_closed", lambda v: v["rps"], 1), rows[7][0]: ("connrate", lambda v: v["per_second"], 1),
}
for label, (metric, get, scale) in spread_of.items():
    for t in ("ours", "haproxy", "direct"):
        spread(label, t, metric, get, scale)
values = {label: {t: get(t) for t in ("ours", "haproxy", "direct")} for label, get, _, _ in rows}
lines = ["| measure (median of %s) | ours | haproxy | direct | ours / haproxy |" % reps, "| --- | ---: | ---: | ---: | ---: |"]
for label, _, f, _ in rows:
    o, h, d = (values[label][t] for t in ("ours", "haproxy", "direct"))
    ratio = "–" if (o is None or h in (None, 0)) else f"{o / h:.2f}×"
    lines.append(f"| {label} | {fmt(f, o)} | {fmt(f, h)} | {fmt(f, d)} | {ratio} |")
for label in [l for l, *_ in rows if "p99" in l]:
    v = values[label]
    lines.append(f"| added {label.replace('latency ', '')} vs direct | {v['ours'] - v['direct']:.0f} | {v['haproxy'] - v['direct']:.0f} | 0 | – |")
lines += ["", "CPU time the proxy process used (user + system, from /proc; lower is better). Unlike rates and",
          "latencies, this hardly depends on what else the machine runs:", "",
          "| measure (median of %s) | ours | haproxy | ours / haproxy |" % reps, "| --- | ---: | ---: | ---: |"]
for label, get, f in cpu_rows:
    o, h = get("ours"), get("haproxy")
    ratio = "–" if (o is None or not h) else f"{o / h:.2f}×"
    lines.append(f"| {label} | {fmt(f, o)} | {fmt(f, h)} | {ratio} |")
lines += ["", f"Spread over the {reps} repetitions (min – max); load average before / after: {load_before} / {load_after}.", "",
          "| measure | ours | haproxy | direct |", "| --- | ---: | ---: | ---: |"]
for label, _, f, _ in rows:
    if label in SPREAD:
        cells = [("–" if t not in SPREAD[label] else f"{fmt(f, SPREAD[label][t][0])} – {fmt(f, SPREAD[label][t][1])}") for t in ("ours", "haproxy", "direct")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
table = "\n".join(lines)
MARK = "<!-- Everything below this line is written by hand and kept when the report is regenerated. -->"
analysis = "\n\n## Analysis\n\n(to be written)\n"
if os.path.exists(out + ".md"):
    old = open(out + ".md").read()
    if MARK in old:
        analysis = old.split(MARK, 1)[1]
svg_name = os.path.basename(out) + ".svg"
event_interval = meta.get("ours_event_interval")
runtime_note = (f" Our proxy's runtime polls its I/O driver every {event_interval} tasks"
                f" (`LB_EVENT_INTERVAL`; tokio's default is 61)." if event_interval else "")
LAYOUTS = {"multi-thread": "one multi-thread runtime, a worker per core (what ships)",
           "per-core": "a current-thread runtime per core, all accepting from one socket",
           "per-core-reuseport": "a current-thread runtime per core, each with its own SO_REUSEPORT socket"}
layout = meta.get("ours_layout")
if layout:
    runtime_note += f" Layout (`LB_LAYOUT`): {layout}, {LAYOUTS.get(layout, 'unknown')}."
head = f"""# Data plane benchmark, {date}: local-data-plane vs haproxy {hap_v} vs direct

Generated by `bench/data-plane/run` ([how to rerun](../data-plane/README.md)); every sample is in
[`bench/data-plane/results/{os.path.basename(out)}.json`](../data-plane/results/{os.path.basename(out)}.json).
Loopback, {meta["cores"]} cores shared by the proxy, the load generators and the backends; each measure {secs:g} s;
medians of {reps} repetitions in which the three targets take turns.{runtime_note}

![bar charts]({svg_name})

"""
open(out + ".md", "w").write(head + table + "\n\n" + MARK + analysis)
print(table)

# The plot: one bar panel per measure, three bars each.
colors = {"ours": "#2b6cb0", "haproxy": "#c05621", "direct": "#718096"}
panels = [(label, f, better) for label, _, f, better in rows] + [(label, f, False) for label, _, f in cpu_rows]
for label, get, _ in cpu_rows:
    values[label] = {"ours": get("ours"), "haproxy": get("haproxy"), "direct": None}
cols, pw, ph = 3, 340, 190
W, H = 20 + cols * (pw + 20), 60 + ((len(panels) + cols - 1) // cols) * (ph + 60)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="20" y="24" font-size="16" font-weight="bold">local-data-plane vs haproxy {hap_v} (TCP mode) vs direct · loopback · {meta["cores"]} cores · {date} · median of {reps}</text>',
       f'<text x="20" y="42" fill="#555">blue: ours · orange: haproxy · grey: direct to the backend (no proxy)</text>']
for i, (label, f, better) in enumerate(panels):
    col, row = i % cols, i // cols
    x0, y0 = 20 + col * (pw + 20), 60 + row * (ph + 60)
    vals = [(n, values[label][n]) for n in ("ours", "haproxy", "direct")]
    vmax = max([v for _, v in vals if v is not None] + [1e-9])
    svg.append(f'<text x="{x0}" y="{y0 + 12}" font-weight="bold">{label}</text>')
    svg.append(f'<text x="{x0}" y="{y0 + 27}" fill="#555">{"higher" if better else "lower"} is better</text>')
    base = y0 + ph
    svg.append(f'<line x1="{x0}" y1="{base}" x2="{x0 + pw - 20}" y2="{base}" stroke="#333"/>')
    for j, (n, v) in enumerate(vals):
        bx = x0 + 20 + j * 100
        if v is None:
            svg.append(f'<text x="{bx + 35}" y="{base - 5}" text-anchor="middle" fill="#999">n/a</text>')
        else:
            h = (ph - 55) * v / vmax
            svg.append(f'<rect x="{bx}" y="{base - h:.1f}" width="70" height="{h:.1f}" fill="{colors[n]}"/>')
            svg.append(f'<text x="{bx + 35}" y="{base - h - 4:.1f}" text-anchor="middle">{fmt(f, v)}</text>')
        svg.append(f'<text x="{bx + 35}" y="{base + 15}" text-anchor="middle">{n}</text>')
svg.append("</svg>")
open(out + ".svg", "w").write("\n".join(svg) + "\n")
