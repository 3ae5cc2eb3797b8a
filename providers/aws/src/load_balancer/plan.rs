//! What a sync would write, recorded instead of written: the load balancer previews of shadow mode
//! run the very same sync code with a [`Plan`], and every write site asks
//! [`LoadBalancers::previewed`](super::LoadBalancers) (or `previewed_backends`) first.

use std::collections::BTreeSet;

/// The writes a sync would make, in words, and the backends (instance IDs) it would add or remove.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Instance IDs that would be registered (with the load balancer or a target group).
    pub added: BTreeSet<String>,
    /// Instance IDs that would be deregistered.
    pub removed: BTreeSet<String>,
    /// Every other change, one sentence each, in the order the sync met them.
    pub changes: Vec<String>,
    /// The load balancer itself would be created (there is none).
    pub creates: bool,
}

impl Plan {
    /// Records a change other than backends (once: the same sentence is not repeated).
    pub fn change(&mut self, change: String) {
        if !self.changes.contains(&change) {
            self.changes.push(change);
        }
    }

    /// Records backends to register and to deregister.
    pub fn backends<'a>(
        &mut self,
        added: impl IntoIterator<Item = &'a str>,
        removed: impl IntoIterator<Item = &'a str>,
    ) {
        self.added.extend(added.into_iter().map(str::to_owned));
        self.removed.extend(removed.into_iter().map(str::to_owned));
    }
}
