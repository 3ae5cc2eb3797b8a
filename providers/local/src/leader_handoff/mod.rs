//! The hand-over of VIPs between two hosts of one L2 segment that keeps the connections already open
//! through the old host: [`nftables`] programs the kernel's packet filter for both sides of it.

#[allow(
    dead_code,
    reason = "nothing of the provider calls it yet; the leader hand-over will"
)]
pub(crate) mod nftables;
