//! The results: a Markdown report with absolute figures and ratios (rust / go) from one run, and a PNG
//! of the per-node initialization delays.

use std::{fmt::Write as _, path::Path, time::Duration};

use plotters::prelude::*;

use crate::{InitResult, Results};

/// What machine the numbers come from.
pub(crate) fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    format!(
        "{cores} cores ({cpu}), {memory:.0} GiB; kube-apiserver v1.37.1 and etcd v3.6.16 on the same machine"
    )
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn ratio(rust: f64, go: f64) -> String {
    if go == 0.0 {
        "—".to_owned()
    } else {
        format!("{:.2}", rust / go)
    }
}

/// The CPU cell of a node-initialization row; empty for results saved before CPU was measured.
fn cpu(row: &InitResult) -> String {
    if row.manager_cpu_seconds == 0.0 && row.apiserver_cpu_seconds == 0.0 {
        return String::new();
    }
    format!(
        "{:.1} s / {:.1} s",
        row.manager_cpu_seconds, row.apiserver_cpu_seconds
    )
}

/// The settings this run measured, in the order they ran.
fn settings_in(results: &Results) -> Vec<&str> {
    let mut settings: Vec<&str> = Vec::new();
    let runs = results
        .inits
        .iter()
        .filter(|i| i.who != "API limit")
        .map(|i| i.settings.as_str())
        .chain(results.lbs.iter().map(|l| l.settings.as_str()));
    for s in runs {
        if !settings.contains(&s) {
            settings.push(s);
        }
    }
    settings
}

fn find<'a, T>(
    items: &'a [T],
    who: &str,
    settings: &str,
    key: impl Fn(&T) -> (&str, &str),
) -> Option<&'a T> {
    items.iter().find(|i| key(i) == (who, settings))
}

/// The report.
pub(crate) fn markdown(results: &Results) -> String {
    let Results {
        inits,
        lbs,
        steadies,
        ..
    } = results;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Benchmark: Rust CCM vs upstream Go CCM ({})\n",
        results.label
    );
    let _ = writeln!(
        md,
        "Machine: {}. One run of `bench/run` ({:.0} min). Cloud latency {} per call for both managers. Ratios are rust / go: below 1 means ours is faster or smaller.\n",
        results.machine, results.minutes, results.latency
    );
    let _ = writeln!(
        md,
        "Settings: **own defaults** = each manager as shipped (Go: QPS 20, burst 30, 1 node worker, 1 service worker; Rust: QPS 200, burst 400, 16 node workers, 16 service workers). **equal settings** = both at QPS 200, burst 400, 16 node workers, 16 service workers. **equal, unthrottled** = both with 16 node and 16 service workers and a client-side limit too high to bind (QPS and burst 100,000).\n"
    );

    let _ = writeln!(md, "## Node initialization\n");
    let _ = writeln!(
        md,
        "Nodes created (32 at a time) as kubelets with `--cloud-provider=external` register them, each with a kubelet-sized status (4 conditions, capacity, allocatable, node info, 30 images), while the manager runs. *Total*: first creation to last node initialized. *Delay*: a node's creation to its initialization. *Writes/node*: the manager's writes (node patch or update, status patch, event) per node, from the API server's own counters (the runner's node creations subtracted); in brackets, how many of them were Events. *CPU*: seconds the manager used over the same span, and (after the slash) the API server. The **API limit** row is a minimal client making the same 3 writes per node with no controller logic and no client-side rate limit.\n"
    );
    let _ = writeln!(
        md,
        "| nodes | settings | manager | total | p50 delay | p99 delay | writes/node | CPU / API server CPU | peak RSS | total ratio | p99 ratio |"
    );
    let _ = writeln!(
        md,
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    let mut counts: Vec<usize> = inits.iter().map(|i| i.nodes).collect();
    counts.dedup();
    for count in counts {
        let rows: Vec<&InitResult> = inits.iter().filter(|i| i.nodes == count).collect();
        for settings in settings_in(results) {
            let go = rows
                .iter()
                .find(|r| r.who == "go" && r.settings == settings);
            for row in rows
                .iter()
                .filter(|r| r.settings == settings && r.who != "API limit")
            {
                let (total_ratio, p99_ratio) = match (row.who.as_str(), go) {
                    ("rust", Some(go)) => (
                        ratio(row.total.as_secs_f64(), go.total.as_secs_f64()),
                        ratio(row.p99.as_secs_f64(), go.p99.as_secs_f64()),
                    ),
                    _ => (String::new(), String::new()),
                };
                let _ = writeln!(
                    md,
                    "| {count} | {settings} | {} | {} | {} | {} | {:.2} ({:.2}) | {} | {:.0} MiB | {total_ratio} | {p99_ratio} |",
                    row.who,
                    secs(row.total),
                    secs(row.p50),
                    secs(row.p99),
                    row.writes_per_node,
                    row.events_per_node,
                    cpu(row),
                    row.peak_rss_mib
                );
            }
        }
        if let Some(limit) = rows.iter().find(|r| r.who == "API limit") {
            let share = rows
                .iter()
                .filter(|r| r.who != "API limit")
                .map(|r| {
                    format!(
                        "{} at {}: {:.0} %",
                        r.who,
                        r.settings,
                        100.0 * limit.total.as_secs_f64() / r.total.as_secs_f64().max(f64::EPSILON)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            let _ = writeln!(
                md,
                "| {count} | no limit | API limit | {} | {} | {} | {:.2} ({:.2}) | {} | — | {share} | |",
                secs(limit.total),
                secs(limit.p50),
                secs(limit.p99),
                limit.writes_per_node,
                limit.events_per_node,
                cpu(limit)
            );
        }
    }

    let _ = writeln!(md, "\n## Load balancers\n");
    let _ = writeln!(
        md,
        "{} LoadBalancer Services over {} nodes: *provision* is creation of the first Service to the last one with an ingress IP. Then {} nodes added and {} removed: *churn* is the time until every load balancer has exactly the new node set, with the cloud's `update_load_balancer` calls (ideal: one per Service) and `ensure_load_balancer` calls made meanwhile. *Writes/Service*: the manager's API writes while provisioning (finalizer, status, events), per Service; in brackets, how many of them were Events.\n",
        results.services, results.lb_nodes, results.churn, results.churn
    );
    let _ = writeln!(
        md,
        "| settings | manager | provision | churn | update calls | ensure calls | writes/Service | provision ratio | churn ratio |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for settings in settings_in(results) {
        let go = find(lbs, "go", settings, |l| (&l.who, &l.settings));
        for who in ["rust", "go"] {
            if let Some(row) = find(lbs, who, settings, |l| (&l.who, &l.settings)) {
                let (p, c) = match (who, go) {
                    ("rust", Some(go)) => (
                        ratio(row.provision.as_secs_f64(), go.provision.as_secs_f64()),
                        ratio(row.churn.as_secs_f64(), go.churn.as_secs_f64()),
                    ),
                    _ => (String::new(), String::new()),
                };
                let _ = writeln!(
                    md,
                    "| {settings} | {who} | {} | {} | {} | {} | {:.2} ({:.2}) | {p} | {c} |",
                    secs(row.provision),
                    secs(row.churn),
                    row.update_calls,
                    row.ensure_calls,
                    row.writes_per_service,
                    row.events_per_service
                );
            }
        }
    }

    let _ = writeln!(md, "\n## Steady state\n");
    let _ = writeln!(
        md,
        "After the largest initialization run, {} LoadBalancer Services are provisioned; after 10 s, an idle window of {} s: the manager's CPU seconds, its requests to the API server (from the API server's counters; watches, and the API server's own lease renewals and OpenAPI reads, excluded), and its cloud calls. *Peak RSS* is the process's high-water mark over the whole run; *idle RSS* its resident memory at the end.\n",
        results.services, results.idle_seconds
    );
    let _ = writeln!(
        md,
        "| settings | manager | peak RSS | idle RSS | idle CPU | API requests in the window | cloud calls in the window | peak RSS ratio | idle RSS ratio |"
    );
    let _ = writeln!(
        md,
        "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"
    );
    for settings in settings_in(results) {
        let go = find(steadies, "go", settings, |s| (&s.who, &s.settings));
        for who in ["rust", "go"] {
            if let Some(row) = find(steadies, who, settings, |s| (&s.who, &s.settings)) {
                let requests = if row.idle_requests.is_empty() {
                    "none".to_owned()
                } else {
                    row.idle_requests
                        .iter()
                        .map(|(request, n)| format!("{request}: {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let (p, i) = match (who, go) {
                    ("rust", Some(go)) => (
                        ratio(row.peak_rss_mib, go.peak_rss_mib),
                        ratio(row.idle_rss_mib, go.idle_rss_mib),
                    ),
                    _ => (String::new(), String::new()),
                };
                let _ = writeln!(
                    md,
                    "| {settings} | {who} | {:.0} MiB | {:.0} MiB | {:.2} s | {requests} | {} | {p} | {i} |",
                    row.peak_rss_mib, row.idle_rss_mib, row.idle_cpu_seconds, row.idle_cloud_calls
                );
            }
        }
    }
    targets(&mut md, results);
    md
}

/// One line of the targets table.
struct Check {
    target: String,
    measured: String,
    met: bool,
}

/// "No more writes per object than upstream": (all writes, event writes) per object of each manager,
/// compared without the events (upstream drops events under load; that is not a saving to copy).
fn writes_check(target: String, rust: (f64, f64), go: (f64, f64)) -> Check {
    let (ours, theirs) = (rust.0 - rust.1, go.0 - go.1);
    Check {
        target,
        measured: format!(
            "{ours:.2} vs {theirs:.2} (events: {:.2} vs {:.2})",
            rust.1, go.1
        ),
        met: ours <= theirs + 0.005,
    }
}

/// The targets of bench/README.md, each checked against this run's numbers.
fn targets(md: &mut String, results: &Results) {
    let mut checks = Vec::new();
    let init = |who: &str, settings: &str, nodes: usize| {
        results
            .inits
            .iter()
            .find(|i| i.who == who && i.settings == settings && i.nodes == nodes)
    };
    let mut counts: Vec<usize> = results.inits.iter().map(|i| i.nodes).collect();
    counts.dedup();
    for &count in &counts {
        for (settings, factor) in [
            ("own defaults", 5.0),
            ("equal settings", 1.5),
            ("equal, unthrottled", 1.5),
        ] {
            if let (Some(rust), Some(go)) =
                (init("rust", settings, count), init("go", settings, count))
            {
                let speedup = go.total.as_secs_f64() / rust.total.as_secs_f64().max(f64::EPSILON);
                checks.push(Check {
                    target: format!(
                        "node init, {count} nodes: ≥ {factor}× faster than upstream at {settings}"
                    ),
                    measured: format!("{speedup:.1}× ({} vs {})", secs(rust.total), secs(go.total)),
                    met: speedup >= factor,
                });
            }
        }
        let limit = results
            .inits
            .iter()
            .find(|i| i.who == "API limit" && i.nodes == count);
        for settings in ["own defaults", "equal, unthrottled"] {
            if let (Some(rust), Some(limit)) = (init("rust", settings, count), limit) {
                let share =
                    100.0 * limit.total.as_secs_f64() / rust.total.as_secs_f64().max(f64::EPSILON);
                checks.push(Check {
                    target: format!("node init, {count} nodes, {settings}: within 80 % of the API server's own limit"),
                    measured: format!("{share:.0} % ({} vs {})", secs(rust.total), secs(limit.total)),
                    met: share >= 80.0,
                });
            }
        }
        for settings in settings_in(results) {
            if let (Some(rust), Some(go)) =
                (init("rust", settings, count), init("go", settings, count))
            {
                checks.push(writes_check(
                    format!("node init, {count} nodes, {settings}: no more Node writes per node than upstream"),
                    (rust.writes_per_node, rust.events_per_node),
                    (go.writes_per_node, go.events_per_node),
                ));
            }
        }
    }
    for settings in settings_in(results) {
        let lb = |who: &str| {
            results
                .lbs
                .iter()
                .find(|l| l.who == who && l.settings == settings)
        };
        if let (Some(rust), Some(go)) = (lb("rust"), lb("go")) {
            checks.push(writes_check(
                format!(
                    "load balancers, {settings}: no more Service writes per Service than upstream"
                ),
                (rust.writes_per_service, rust.events_per_service),
                (go.writes_per_service, go.events_per_service),
            ));
            checks.push(Check {
                target: format!("load balancers, {settings}: no more cloud update calls in the churn than upstream"),
                measured: format!("{} vs {}", rust.update_calls, go.update_calls),
                met: rust.update_calls <= go.update_calls,
            });
        }
    }
    let largest = results.inits.iter().map(|i| i.nodes).max().unwrap_or(0);
    for settings in settings_in(results) {
        let steady = |who: &str| {
            results
                .steadies
                .iter()
                .find(|s| s.who == who && s.settings == settings)
        };
        if let (Some(rust), Some(go)) = (steady("rust"), steady("go")) {
            let share = rust.peak_rss_mib / go.peak_rss_mib.max(f64::EPSILON);
            checks.push(Check {
                target: format!("steady state ({largest} nodes + {} Services), {settings}: peak RSS ≤ 0.25× upstream's", results.services),
                measured: format!("{share:.2}× ({:.0} vs {:.0} MiB)", rust.peak_rss_mib, go.peak_rss_mib),
                met: share <= 0.25,
            });
        }
        if let Some(rust) = steady("rust") {
            let writes: u64 = rust
                .idle_requests
                .iter()
                .filter(|(request, _)| request.split(' ').next().is_some_and(crate::is_write))
                .map(|(_, n)| n)
                .sum();
            checks.push(Check {
                target: format!("steady state ({largest} nodes + {} Services), {settings}: zero API writes and zero cloud calls when idle", results.services),
                measured: format!("{writes} writes, {} cloud calls", rust.idle_cloud_calls),
                met: writes == 0 && rust.idle_cloud_calls == 0,
            });
        }
    }
    let _ = writeln!(md, "\n## Targets\n");
    let _ = writeln!(
        md,
        "The targets of `bench/README.md`, checked against the numbers above. Writes per object are compared without Events (shown apart: a manager that drops events under load writes fewer of them).\n"
    );
    let _ = writeln!(md, "| target | measured (rust vs go or limit) | met |");
    let _ = writeln!(md, "| --- | --- | --- |");
    for check in checks {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            check.target,
            check.measured,
            if check.met { "yes" } else { "**no**" }
        );
    }
    let _ = writeln!(
        md,
        "\nPer-node initialization delays: the PNG beside this file."
    );
}

/// Ours in warm colors, upstream's in cool ones, the API limit in black: one color per line.
fn color_of(run: &InitResult) -> RGBColor {
    match (run.who.as_str(), run.settings.as_str()) {
        ("rust", "own defaults") => RGBColor(200, 0, 0),
        ("rust", "equal settings") => RGBColor(255, 140, 0),
        ("rust", _) => RGBColor(170, 0, 170),
        ("go", "own defaults") => RGBColor(0, 0, 200),
        ("go", "equal settings") => RGBColor(0, 160, 220),
        ("go", _) => RGBColor(0, 140, 0),
        _ => BLACK,
    }
}

/// Per-node initialization delay (sorted) of every run of the largest node count.
pub(crate) fn plot(path: &Path, inits: &[InitResult]) -> anyhow::Result<()> {
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("cannot load the font"))?;
    let largest = inits.iter().map(|i| i.nodes).max().unwrap_or(0);
    let runs: Vec<&InitResult> = inits.iter().filter(|i| i.nodes == largest).collect();
    let max_delay = runs
        .iter()
        .flat_map(|r| r.delays.iter().copied())
        .fold(1.0_f64, f64::max);
    let root = BitMapBackend::new(path, (1200, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("Per-node initialization delay, {largest} nodes (sorted)"),
            ("sans-serif", 26),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..100.0, (0.01..max_delay * 1.2).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("nodes, % (sorted by delay)")
        .y_desc("seconds from creation (log)")
        .label_style(("sans-serif", 16))
        .draw()?;
    for run in runs.iter() {
        let color = color_of(run);
        let n = run.delays.len().max(1) as f64;
        chart
            .draw_series(LineSeries::new(
                run.delays
                    .iter()
                    .enumerate()
                    .map(|(j, d)| (100.0 * j as f64 / n, d.max(0.01))),
                color.stroke_width(2),
            ))?
            .label(format!("{} ({})", run.who, run.settings))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
