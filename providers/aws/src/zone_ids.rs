//! Availability-zone IDs (`usw2-az1`) for zone names (`us-west-2a`), for the node label
//! `topology.k8s.aws/zone-id`, as upstream's `zoneCache`: one `DescribeAvailabilityZones` for the whole
//! region, asked again only when a zone is not known yet (zones rarely change, accounts gain new ones).

use std::collections::BTreeMap;

use tokio::sync::Mutex;

use crate::{Error, error::Result, sdk::Calls};

/// The node label upstream sets to the zone ID (`well_known_labels.go`: `LabelZoneID`).
pub const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";

/// Zone name → zone ID, filled from `DescribeAvailabilityZones`.
pub struct ZoneIds {
    calls: Calls,
    /// Held across the call, so a burst of node initializations asks AWS once, not once per node.
    known: Mutex<BTreeMap<String, String>>,
}

impl ZoneIds {
    /// An empty cache over `calls`.
    pub fn new(calls: Calls) -> Self {
        Self {
            calls,
            known: Mutex::new(BTreeMap::new()),
        }
    }

    /// The ID of `zone`; an error when the region has no such zone (upstream fails the node's
    /// initialization then, and so does this).
    #[tracing::instrument(skip(self))]
    pub async fn zone_id(&self, zone: &str) -> Result<String> {
        let mut known = self.known.lock().await;
        if let Some(id) = known.get(zone) {
            return Ok(id.clone());
        }
        let ec2 = &self.calls.clients.ec2;
        let answer = self
            .calls
            .call("DescribeAvailabilityZones", || {
                ec2.describe_availability_zones().send()
            })
            .await?;
        for az in answer.availability_zones() {
            if let (Some(name), Some(id)) = (az.zone_name(), az.zone_id()) {
                known.insert(name.to_owned(), id.to_owned());
            }
        }
        known.get(zone).cloned().ok_or_else(|| {
            Error::Setup(format!(
                "DescribeAvailabilityZones does not list the zone {zone:?}, so the label {ZONE_ID_LABEL} cannot be set"
            ))
        })
    }
}
