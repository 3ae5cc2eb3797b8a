//! Repeated node-initialization rows (`--rounds`), judged at their medians: on this 2-core machine one
//! row moves 14–27 % between runs (bench/results/2026-11-27-10k-rounds.md), more than several targets'
//! margins, so one run cannot decide them.

use std::{collections::BTreeMap, time::Duration};

use crate::InitResult;

/// One row per (manager, settings, node count), in the order first measured. A row measured once is
/// kept as it is. A row measured more than once becomes the median of its runs, each figure on its own
/// (so a total and an API-server CPU figure may come from different runs); the per-node delays and the
/// pace are those of the run with the median total; the error counts are the most any run had (an error
/// in one run of three is not hidden); `round_totals` lists every run's total, in the order measured.
pub(crate) fn medians(inits: &[InitResult]) -> Vec<InitResult> {
    let mut rows: Vec<Vec<&InitResult>> = Vec::new();
    for init in inits {
        match rows.iter_mut().find(|row| same_row(row[0], init)) {
            Some(row) => row.push(init),
            None => rows.push(vec![init]),
        }
    }
    rows.into_iter().map(median_row).collect()
}

fn same_row(a: &InitResult, b: &InitResult) -> bool {
    a.who == b.who && a.settings == b.settings && a.nodes == b.nodes
}

fn median_row(runs: Vec<&InitResult>) -> InitResult {
    if runs.len() == 1 {
        return runs[0].clone();
    }
    let mut by_total = runs.clone();
    by_total.sort_by_key(|r| r.total);
    let middle = by_total[(by_total.len() - 1) / 2];
    let of = |figure: fn(&InitResult) -> f64| median(runs.iter().map(|r| figure(r)).collect());
    let seconds = |figure: fn(&InitResult) -> Duration| {
        Duration::from_secs_f64(median(
            runs.iter().map(|r| figure(r).as_secs_f64()).collect(),
        ))
    };
    InitResult {
        total: seconds(|r| r.total),
        p50: seconds(|r| r.p50),
        p99: seconds(|r| r.p99),
        writes_per_node: of(|r| r.writes_per_node),
        events_per_node: of(|r| r.events_per_node),
        peak_rss_mib: of(|r| r.peak_rss_mib),
        manager_cpu_seconds: of(|r| r.manager_cpu_seconds),
        apiserver_cpu_seconds: of(|r| r.apiserver_cpu_seconds),
        requests: median_counts(runs.iter().map(|r| &r.requests)),
        etcd: median_counts(runs.iter().map(|r| &r.etcd)),
        errors: most_counts(runs.iter().map(|r| &r.errors)),
        profiled: runs.iter().any(|r| r.profiled),
        round_totals: runs.iter().map(|r| r.total.as_secs_f64()).collect(),
        ..middle.clone()
    }
}

/// The median; of an even count, the mean of the two in the middle.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Each key's median over the runs (a run without the key counts 0); keys whose median is 0 dropped.
fn median_counts<'a>(
    runs: impl Iterator<Item = &'a BTreeMap<String, u64>> + Clone,
) -> BTreeMap<String, u64> {
    let keys: std::collections::BTreeSet<&String> = runs.clone().flat_map(|r| r.keys()).collect();
    keys.into_iter()
        .filter_map(|key| {
            let values = runs
                .clone()
                .map(|r| r.get(key).copied().unwrap_or(0) as f64)
                .collect();
            let m = median(values).round() as u64;
            (m > 0).then(|| (key.clone(), m))
        })
        .collect()
}

/// Each key's largest count over the runs.
fn most_counts<'a>(runs: impl Iterator<Item = &'a BTreeMap<String, u64>>) -> BTreeMap<String, u64> {
    let mut most = BTreeMap::new();
    for run in runs {
        for (key, n) in run {
            let entry = most.entry(key.clone()).or_insert(0);
            *entry = (*entry).max(*n);
        }
    }
    most
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(who: &str, nodes: usize, total: f64, api_cpu: f64) -> InitResult {
        InitResult {
            who: who.to_owned(),
            settings: "equal, unthrottled".to_owned(),
            nodes,
            total: Duration::from_secs_f64(total),
            p50: Duration::from_secs_f64(total / 2.0),
            p99: Duration::from_secs_f64(total),
            writes_per_node: 3.0,
            events_per_node: 1.0,
            delays: vec![total],
            peak_rss_mib: 10.0,
            manager_cpu_seconds: 1.0,
            apiserver_cpu_seconds: api_cpu,
            requests: BTreeMap::from([("PUT nodes".to_owned(), nodes as u64)]),
            errors: BTreeMap::new(),
            qps: 0.0,
            burst: 0.0,
            profiled: false,
            etcd: BTreeMap::new(),
            pace: None,
            round_totals: Vec::new(),
        }
    }

    #[test]
    fn a_row_measured_once_is_kept_as_it_is() {
        let rows = medians(&[run("rust", 1000, 9.0, 12.0), run("go", 1000, 10.0, 13.0)]);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].total, Duration::from_secs(9));
        assert!(rows[0].round_totals.is_empty());
        assert_eq!(rows[1].who, "go");
    }

    #[test]
    fn each_figure_is_its_own_median_and_the_delays_come_from_the_median_total() {
        // Interleaved rounds of two managers, as `--rounds 3` measures them.
        let inits = [
            run("rust", 1000, 70.0, 100.0),
            run("go", 1000, 80.0, 90.0),
            run("rust", 1000, 60.0, 120.0),
            run("go", 1000, 85.0, 95.0),
            run("rust", 1000, 65.0, 90.0),
            run("go", 1000, 75.0, 99.0),
        ];
        let rows = medians(&inits);
        assert_eq!(
            rows.iter().map(|r| r.who.as_str()).collect::<Vec<_>>(),
            ["rust", "go"]
        );
        let rust = &rows[0];
        assert_eq!(rust.total, Duration::from_secs(65));
        assert_eq!(
            rust.apiserver_cpu_seconds, 100.0,
            "from another run than the total"
        );
        assert_eq!(rust.delays, vec![65.0], "the median-total run's delays");
        assert_eq!(rust.round_totals, vec![70.0, 60.0, 65.0]);
        assert_eq!(rows[1].total, Duration::from_secs(80));
    }

    #[test]
    fn an_even_count_takes_the_mean_of_the_middle_two() {
        let rows = medians(&[run("rust", 10, 10.0, 1.0), run("rust", 10, 20.0, 3.0)]);
        assert_eq!(rows[0].total, Duration::from_secs(15));
        assert_eq!(rows[0].apiserver_cpu_seconds, 2.0);
        assert_eq!(
            rows[0].delays,
            vec![10.0],
            "the lower of the two middle runs"
        );
    }

    #[test]
    fn counts_are_medians_per_key_and_errors_the_most_any_run_had() {
        let mut a = run("rust", 10, 1.0, 1.0);
        let mut b = run("rust", 10, 2.0, 1.0);
        let c = run("rust", 10, 3.0, 1.0);
        a.requests.insert("GET nodes".to_owned(), 4);
        b.requests.insert("GET nodes".to_owned(), 6);
        a.errors.insert("PUT nodes 409".to_owned(), 2);
        let rows = medians(&[a, b, c]);
        assert_eq!(rows[0].requests.get("GET nodes"), Some(&4));
        assert_eq!(rows[0].requests.get("PUT nodes"), Some(&10));
        assert_eq!(rows[0].errors.get("PUT nodes 409"), Some(&2));
    }

    #[test]
    fn the_same_manager_at_another_size_or_settings_is_another_row() {
        let mut equal = run("rust", 1000, 9.0, 1.0);
        equal.settings = "equal settings".to_owned();
        let rows = medians(&[
            run("rust", 1000, 9.0, 1.0),
            run("rust", 5000, 50.0, 1.0),
            equal,
        ]);
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.round_totals.is_empty()));
    }
}
