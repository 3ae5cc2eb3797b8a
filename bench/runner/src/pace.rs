//! Where a node-initialization run spends its time: how long the first tenth of the nodes took to
//! initialize, the rate across the middle 80 %, and how long the last tenth took. A total over the
//! token-bucket floor can come from a slow start, a long tail, or a rate under the bucket's throughout;
//! the total alone cannot tell which.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The pace of one run, in seconds from the first node's creation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Pace {
    /// When the runner had created the last node.
    pub(crate) created_all: f64,
    /// When the first tenth of the nodes had been initialized.
    pub(crate) first_tenth: f64,
    /// Nodes initialized per second between the 10th and the 90th percentile.
    pub(crate) middle_rate: f64,
    /// How long the last tenth took, from the 90th percentile to the last node.
    pub(crate) last_tenth: f64,
    /// The initialization's two writes seen landing in each whole second from the first creation: the
    /// node losing its taint, and its status gaining a cloud address. Under a token bucket, a second
    /// below QPS after the burst is a second the bucket's tokens went unused (or waited in it).
    #[serde(default)]
    pub(crate) writes_per_second: Vec<u32>,
}

/// How many of the first seconds [`Pace`]'s `Display` shows.
const SHOWN_SECONDS: usize = 20;

impl std::fmt::Display for Pace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "all created by {:.1} s; first 10 % initialized by {:.1} s, the middle 80 % at {:.1} nodes/s, the last 10 % in {:.1} s",
            self.created_all, self.first_tenth, self.middle_rate, self.last_tenth
        )?;
        if !self.writes_per_second.is_empty() {
            let shown: Vec<String> = self
                .writes_per_second
                .iter()
                .take(SHOWN_SECONDS)
                .map(u32::to_string)
                .collect();
            write!(
                f,
                "; writes landed per second: {}{}",
                shown.join(" "),
                if self.writes_per_second.len() > SHOWN_SECONDS {
                    " …"
                } else {
                    ""
                }
            )?;
        }
        Ok(())
    }
}

/// The pace of a run from when each node was created, initialized and given its addresses; `None` under
/// 10 nodes (no tenths) or when the middle 80 % initialized within the same instant (no rate).
pub(crate) fn pace(
    created: impl IntoIterator<Item = Instant>,
    initialized: impl IntoIterator<Item = Instant>,
    addressed: impl IntoIterator<Item = Instant>,
) -> Option<Pace> {
    let created: Vec<Instant> = created.into_iter().collect();
    let start = *created.iter().min()?;
    let since = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
    let created_all = created.iter().map(|t| since(*t)).fold(0.0, f64::max);
    let mut done: Vec<f64> = initialized.into_iter().map(since).collect();
    if done.len() < 10 {
        return None;
    }
    let mut writes_per_second = Vec::new();
    for second in done.iter().copied().chain(addressed.into_iter().map(since)) {
        let bin = second as usize;
        if writes_per_second.len() <= bin {
            writes_per_second.resize(bin + 1, 0);
        }
        writes_per_second[bin] += 1;
    }
    done.sort_by(f64::total_cmp);
    let at = |fraction: f64| ((done.len() - 1) as f64 * fraction).round() as usize;
    let (tenth, ninetieth) = (at(0.1), at(0.9));
    let span = done[ninetieth] - done[tenth];
    (span > 0.0).then(|| Pace {
        created_all,
        first_tenth: done[tenth],
        middle_rate: (ninetieth - tenth) as f64 / span,
        last_tenth: done[done.len() - 1] - done[ninetieth],
        writes_per_second,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(start: Instant, secs: impl IntoIterator<Item = f64>) -> Vec<Instant> {
        secs.into_iter()
            .map(|s| start + Duration::from_secs_f64(s))
            .collect()
    }

    #[test]
    fn a_steady_run_has_its_rate_in_the_middle_and_short_ends() {
        let start = Instant::now();
        // 101 nodes created in the first second, one initialized every 10 ms from 0.5 s on.
        let created = at(start, (0..=100).map(|i| f64::from(i) / 100.0));
        let done = at(start, (0..=100).map(|i| 0.5 + f64::from(i) / 100.0));
        let addressed = at(start, (0..=100).map(|i| 0.55 + f64::from(i) / 100.0));
        let pace = pace(created, done, addressed).unwrap();
        assert!((pace.created_all - 1.0).abs() < 1e-6, "{pace:?}");
        assert!((pace.first_tenth - 0.6).abs() < 1e-6, "{pace:?}");
        assert!((pace.middle_rate - 100.0).abs() < 1e-3, "{pace:?}");
        assert!((pace.last_tenth - 0.1).abs() < 1e-6, "{pace:?}");
        // Initializations at 0.50..=0.99 s and addresses at 0.55..=0.99 s in second 0; the rest in 1.
        assert_eq!(pace.writes_per_second, vec![50 + 45, 51 + 56]);
        assert!(
            pace.to_string()
                .ends_with("writes landed per second: 95 107"),
            "{pace}"
        );
    }

    #[test]
    fn a_long_tail_shows_in_the_last_tenth_not_in_the_rate() {
        let start = Instant::now();
        let created = at(start, [0.0; 11]);
        // Ten nodes one per second, then the last one 20 s late.
        let done = at(start, (1..=10).map(f64::from).chain([30.0]));
        let pace = pace(created, done, []).unwrap();
        assert!((pace.middle_rate - 1.0).abs() < 1e-9, "{pace:?}");
        assert!((pace.last_tenth - 20.0).abs() < 1e-9, "{pace:?}");
        assert!((pace.first_tenth - 2.0).abs() < 1e-9, "{pace:?}");
    }

    #[test]
    fn too_few_nodes_or_no_span_have_no_pace() {
        let start = Instant::now();
        assert_eq!(pace(at(start, [0.0; 9]), at(start, [1.0; 9]), []), None);
        assert_eq!(pace(at(start, [0.0; 20]), at(start, [1.0; 20]), []), None);
        assert_eq!(pace(Vec::new(), at(start, [1.0; 20]), []), None);
    }
}
