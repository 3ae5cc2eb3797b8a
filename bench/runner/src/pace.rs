//! Where a node-initialization run spends its time: how long the first tenth of the nodes took to
//! initialize, the rate across the middle 80 %, and how long the last tenth took. A total over the
//! token-bucket floor can come from a slow start, a long tail, or a rate under the bucket's throughout;
//! the total alone cannot tell which.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The pace of one run, in seconds from the first node's creation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Pace {
    /// When the runner had created the last node.
    pub(crate) created_all: f64,
    /// When the first tenth of the nodes had been initialized.
    pub(crate) first_tenth: f64,
    /// Nodes initialized per second between the 10th and the 90th percentile.
    pub(crate) middle_rate: f64,
    /// How long the last tenth took, from the 90th percentile to the last node.
    pub(crate) last_tenth: f64,
}

impl std::fmt::Display for Pace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "all created by {:.1} s; first 10 % initialized by {:.1} s, the middle 80 % at {:.1} nodes/s, the last 10 % in {:.1} s",
            self.created_all, self.first_tenth, self.middle_rate, self.last_tenth
        )
    }
}

/// The pace of a run from when each node was created and initialized; `None` under 10 nodes (no
/// tenths) or when the middle 80 % initialized within the same instant (no rate).
pub(crate) fn pace(
    created: impl IntoIterator<Item = Instant>,
    initialized: impl IntoIterator<Item = Instant>,
) -> Option<Pace> {
    let created: Vec<Instant> = created.into_iter().collect();
    let start = *created.iter().min()?;
    let since = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
    let created_all = created.iter().map(|t| since(*t)).fold(0.0, f64::max);
    let mut done: Vec<f64> = initialized.into_iter().map(since).collect();
    if done.len() < 10 {
        return None;
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
        let pace = pace(created, done).unwrap();
        assert!((pace.created_all - 1.0).abs() < 1e-6, "{pace:?}");
        assert!((pace.first_tenth - 0.6).abs() < 1e-6, "{pace:?}");
        assert!((pace.middle_rate - 100.0).abs() < 1e-3, "{pace:?}");
        assert!((pace.last_tenth - 0.1).abs() < 1e-6, "{pace:?}");
    }

    #[test]
    fn a_long_tail_shows_in_the_last_tenth_not_in_the_rate() {
        let start = Instant::now();
        let created = at(start, [0.0; 11]);
        // Ten nodes one per second, then the last one 20 s late.
        let done = at(start, (1..=10).map(f64::from).chain([30.0]));
        let pace = pace(created, done).unwrap();
        assert!((pace.middle_rate - 1.0).abs() < 1e-9, "{pace:?}");
        assert!((pace.last_tenth - 20.0).abs() < 1e-9, "{pace:?}");
        assert!((pace.first_tenth - 2.0).abs() < 1e-9, "{pace:?}");
    }

    #[test]
    fn too_few_nodes_or_no_span_have_no_pace() {
        let start = Instant::now();
        assert_eq!(pace(at(start, [0.0; 9]), at(start, [1.0; 9])), None);
        assert_eq!(pace(at(start, [0.0; 20]), at(start, [1.0; 20])), None);
        assert_eq!(pace(Vec::new(), at(start, [1.0; 20])), None);
    }
}
