//! What the agent's `/healthz` and `/readyz` say: alive while its loop keeps looking or a look keeps
//! making progress (a look that never ends, such as a data-plane change stuck, makes it unhealthy, and
//! the kubelet restarts it; a long one that serves Service after Service, as the first look at
//! thousands of them, does not); ready
//! while it may announce (not fenced: cut off from its peers, or from the API server without
//! membership).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use crate::instances::lock;

/// How long without a finished look makes the agent unhealthy: three times the longest wait between
/// two looks ([`super::IDLE_LOOK`]).
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct State {
    last_look: Option<Instant>,
    /// The last step of a look still going (a Service served, a VIP withdrawn).
    last_progress: Option<Instant>,
    fenced: Option<String>,
    /// A part of the agent that died (a watch whose task panicked or ended): unhealthy for good.
    dead: Option<String>,
    /// The agent's supervised tasks: unhealthy for good once one failed.
    tasks: Option<cloud_provider::Supervisor>,
}

/// The agent's health; clones share it.
#[derive(Debug, Clone, Default)]
pub struct AgentHealth {
    state: Arc<Mutex<State>>,
}

impl AgentHealth {
    /// A look finished at `at`; `fenced`: why this node may not announce, if it may not.
    pub(crate) fn looked(&self, at: Instant, fenced: Option<String>) {
        let mut state = lock(&self.state);
        state.last_look = Some(at);
        state.fenced = fenced;
    }

    /// A look still going made a step at `at` (served a Service, withdrew a VIP): it is not stuck.
    pub(crate) fn progressed(&self, at: Instant) {
        lock(&self.state).last_progress = Some(at);
    }

    /// From now on `/healthz` fails, for good, once one of `supervisor`'s tasks has failed.
    pub(crate) fn watch_tasks(&self, supervisor: cloud_provider::Supervisor) {
        lock(&self.state).tasks = Some(supervisor);
    }

    /// `what` (a part of the agent) panicked or ended (`why`): `/healthz` fails from now on.
    pub(crate) fn part_died(&self, what: &str, why: &str) {
        lock(&self.state)
            .dead
            .get_or_insert_with(|| format!("{what} {why}; the agent must restart"));
    }

    /// `/healthz`: `Err` (why) when a look started but none finished, and the one going made no step,
    /// for 30 s (three times the longest wait between two looks), and for good once a part of the
    /// agent died.
    pub fn live(&self) -> Result<(), String> {
        self.live_at(Instant::now())
    }

    fn live_at(&self, now: Instant) -> Result<(), String> {
        let state = lock(&self.state);
        if let Some(dead) = &state.dead {
            return Err(dead.clone());
        }
        if let Some(tasks) = &state.tasks {
            tasks
                .check()
                .map_err(|why| format!("{why}; the agent must restart"))?;
        }
        let Some(looked) = state.last_look else {
            return Ok(());
        };
        let moved = state
            .last_progress
            .map_or(looked, |progress| progress.max(looked));
        let idle = now.saturating_duration_since(moved);
        if idle > STUCK_AFTER {
            return Err(format!(
                "the agent's last look finished {:.0}s ago and the one going has made no step for {:.0}s \
                 (stuck: a look ends, or makes a step, within {}s)",
                now.saturating_duration_since(looked).as_secs_f64(),
                idle.as_secs_f64(),
                STUCK_AFTER.as_secs()
            ));
        }
        Ok(())
    }

    /// `/readyz`: `Err` (why) before the first look, and while this node may not announce.
    pub fn ready(&self) -> Result<(), String> {
        let state = lock(&self.state);
        match (&state.last_look, &state.fenced) {
            (None, _) => Err("the agent has not looked at the cluster yet".to_owned()),
            (Some(_), Some(why)) => Err(format!("fenced: {why}")),
            (Some(_), None) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_part_fails_liveness_for_good() {
        let health = AgentHealth::default();
        health.looked(Instant::now(), None);
        assert_eq!(health.live(), Ok(()));
        health.part_died("the watch of services", "panicked: a bug");
        health.part_died("the watch of nodes", "ended");
        health.looked(Instant::now(), None);
        assert_eq!(
            health.live(),
            Err("the watch of services panicked: a bug; the agent must restart".to_owned())
        );
    }

    #[tokio::test]
    async fn a_failed_supervised_task_fails_liveness_for_good() {
        let health = AgentHealth::default();
        let supervisor = cloud_provider::Supervisor::new(
            Default::default(),
            tokio_util::sync::CancellationToken::new(),
        );
        health.watch_tasks(supervisor.clone());
        health.looked(Instant::now(), None);
        assert_eq!(health.live(), Ok(()));
        let ends = cloud_provider::supervise::Ends::AtShutdown;
        supervisor.spawn_once("MetalLB's objects", ends, async {});
        while supervisor.check().is_ok() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        health.looked(Instant::now(), None);
        assert_eq!(
            health.live(),
            Err(
                "the task \"MetalLB's objects\" ended while the process was not stopping; the \
                 agent must restart"
                    .to_owned()
            )
        );
    }

    #[test]
    fn live_while_looking_ready_while_not_fenced() {
        let health = AgentHealth::default();
        assert!(health.live().is_ok(), "alive before the first look");
        assert!(health.ready().unwrap_err().contains("not looked"));
        let start = Instant::now();
        health.looked(start, None);
        assert!(health.ready().is_ok());
        assert!(health.live_at(start + STUCK_AFTER).is_ok());
        let stuck = health.live_at(start + STUCK_AFTER + Duration::from_secs(1));
        assert!(stuck.unwrap_err().contains("stuck"));
        health.looked(start, Some("cut off".into()));
        assert_eq!(health.ready().unwrap_err(), "fenced: cut off");
    }

    #[test]
    fn a_long_look_that_makes_steps_is_not_stuck() {
        let health = AgentHealth::default();
        let start = Instant::now();
        health.looked(start, None);
        // A look at thousands of new Services: a step every few seconds, for minutes.
        let mut at = start;
        for _ in 0..60 {
            at += Duration::from_secs(5);
            health.progressed(at);
            assert!(health.live_at(at + STUCK_AFTER).is_ok());
        }
        let stuck = health
            .live_at(at + STUCK_AFTER + Duration::from_secs(1))
            .unwrap_err();
        assert!(
            stuck.contains("last look finished 331s ago") && stuck.contains("no step for 31s"),
            "{stuck}"
        );
    }
}
