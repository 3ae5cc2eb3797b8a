//! Who is alive, and whether this node may announce: the rules that keep VIPs served while the API
//! server is away and still never leave two nodes announcing one VIP for longer than a failover.
//!
//! Two signals: the heartbeat Leases (through the API server, [`super::heartbeat`]) and the membership
//! protocol between the agents ([`super::membership`], over the node network). The rules:
//!
//! 1. **A peer that speaks membership** (its Lease names its membership address) **is alive while it
//!    is a member** of this agent's view, whatever its Lease says: a node cut from the API server but
//!    not from its peers keeps its VIPs, and an API server that is down for everyone changes nothing.
//!    A peer that does not speak it (membership off there, or an older agent) is alive while its Lease
//!    is fresh, as before.
//! 2. **The count.** The nodes a majority is counted among are those alive by either signal. It is
//!    only updated while this agent reaches the API server (its own renewals succeed): a node is
//!    forgotten when its Lease is stale (or gone) *and* it is no member. While this agent cannot reach
//!    the API server, the last count stands and can only grow.
//! 3. **This node announces only from the side of a majority**: the nodes alive in its view (itself
//!    included) are more than half of the count, or exactly half with the count's lowest name among
//!    them (a split into two equal halves keeps one). A node cut from its peers sees itself alone and
//!    stops announcing, while the others, a majority, take its VIPs.
//! 4. **Membership that hears nobody.** Until this agent has heard any peer, membership does not decide
//!    for it unless some peer reports (in its Lease) hearing others: then this agent is the one cut off.
//!    When nobody hears anybody (the membership port blocked everywhere), the Leases decide, as without
//!    membership, and the agent warns.
//! 5. **Without membership** (no key), as before: a peer is alive while its Lease is fresh, and this
//!    node announces only while its own renewals succeed.

use std::collections::BTreeSet;

/// What this agent knows at one look.
#[derive(Debug, Clone, Default)]
pub(crate) struct Signals {
    /// This node.
    pub me: String,
    /// Whether this agent's own renewals succeed (it reaches the API server).
    pub self_fresh: bool,
    /// The peers whose Lease is fresh (as this agent saw it change).
    pub lease_alive: BTreeSet<String>,
    /// The peers whose Lease says they speak membership.
    pub speaks_membership: BTreeSet<String>,
    /// The peers whose Lease says they hear at least one other member.
    pub hears_others: BTreeSet<String>,
    /// The membership view: `None` when membership is off here, or still joining.
    pub members: Option<BTreeSet<String>>,
    /// Whether any peer has been a member since this agent started.
    pub heard_any: bool,
}

/// What the rules decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Judgement {
    /// The nodes alive (this one included when it may announce).
    pub alive: BTreeSet<String>,
    /// Whether this node may announce.
    pub serving: bool,
    /// Why not, when it may not.
    pub fenced_because: Option<String>,
    /// Whether membership decided (rather than the Leases alone).
    pub by_membership: bool,
}

/// The rules, with the count they keep between looks.
#[derive(Debug, Default)]
pub(crate) struct Judge {
    counted: BTreeSet<String>,
}

impl Judge {
    /// Judges one look.
    pub(crate) fn judge(&mut self, s: &Signals) -> Judgement {
        let members = s.members.as_ref().filter(|_| {
            s.heard_any
                || s.hears_others
                    .iter()
                    .any(|p| s.speaks_membership.contains(p))
        });
        let Some(members) = members else {
            // Rule 5 (and 4, when nobody hears anybody).
            let mut alive = s.lease_alive.clone();
            alive.remove(&s.me);
            if s.self_fresh {
                alive.insert(s.me.clone());
            }
            self.counted = alive.clone();
            self.counted.insert(s.me.clone());
            return Judgement {
                alive,
                serving: s.self_fresh,
                fenced_because: (!s.self_fresh).then(|| {
                    "this node's heartbeat could not be renewed for the heartbeat's duration (the \
                     API server is unreachable from it) and membership is off"
                        .to_owned()
                }),
                by_membership: false,
            };
        };
        // Rule 1.
        let lease_peers = s
            .lease_alive
            .iter()
            .filter(|p| !s.speaks_membership.contains(*p));
        let mut alive: BTreeSet<String> = members
            .iter()
            .chain(lease_peers)
            .filter(|p| **p != s.me)
            .cloned()
            .collect();
        // Rule 2.
        if s.self_fresh {
            self.counted = s.lease_alive.union(&alive).cloned().collect();
        } else {
            self.counted.extend(alive.iter().cloned());
        }
        self.counted.insert(s.me.clone());
        // Rule 3.
        alive.insert(s.me.clone());
        let side = alive.len();
        let count = self.counted.len();
        let lowest = self.counted.first().is_some_and(|l| alive.contains(l));
        let serving = 2 * side > count || (2 * side == count && lowest);
        if !serving {
            alive.remove(&s.me);
        }
        Judgement {
            fenced_because: (!serving).then(|| {
                format!(
                    "this node hears {} of the {count} agents counted ({}) through membership: a \
                     minority, so it may be the one cut off, and the others announce its VIPs",
                    side,
                    self.counted.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            }),
            alive,
            serving,
            by_membership: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    /// A healthy cluster of `a`, `b`, `c`, all speaking membership, seen from `me`.
    fn healthy(me: &str) -> Signals {
        let all = set(&["a", "b", "c"]);
        let mut peers = all.clone();
        peers.remove(me);
        Signals {
            me: me.to_owned(),
            self_fresh: true,
            lease_alive: peers.clone(),
            speaks_membership: peers.clone(),
            hears_others: peers.clone(),
            members: Some(peers),
            heard_any: true,
        }
    }

    /// Judges `steps` in order with one judge (the count carries over): the last judgement.
    fn run(steps: &[Signals]) -> Judgement {
        let mut judge = Judge::default();
        let mut last = None;
        for s in steps {
            last = Some(judge.judge(s));
        }
        last.unwrap()
    }

    #[test]
    fn the_cases_the_rules_decide() {
        // (what, the looks, the nodes alive at the end, whether `me` serves)
        let api_down = |me: &str| Signals {
            self_fresh: false,
            lease_alive: BTreeSet::new(),
            ..healthy(me)
        };
        let cut_from_peers = |me: &str| Signals {
            members: Some(BTreeSet::new()),
            ..healthy(me)
        };
        let mut others_without_c = healthy("a");
        others_without_c.members = Some(set(&["b"]));
        let half = |me: &str, mine: &[&str]| {
            let mut s = healthy(me);
            s.lease_alive = set(&["a", "b", "c", "d"]);
            s.lease_alive.remove(me);
            s.speaks_membership = s.lease_alive.clone();
            s.hears_others = s.lease_alive.clone();
            let mut members = set(mine);
            members.remove(me);
            s.members = Some(members);
            s
        };
        let table: Vec<(&str, Vec<Signals>, &[&str], bool)> = vec![
            ("healthy", vec![healthy("a")], &["a", "b", "c"], true),
            // The API server down for everyone: every Lease stale, this node's renewals failing; the
            // members still hear each other, so nothing moves.
            (
                "API server down for everyone",
                vec![healthy("a"), api_down("a")],
                &["a", "b", "c"],
                true,
            ),
            // `c` cut from the API server only: its Lease stale, but a member.
            (
                "a peer cut from the API server only",
                vec![healthy("a"), {
                    let mut s = healthy("a");
                    s.lease_alive = set(&["b"]);
                    s
                }],
                &["a", "b", "c"],
                true,
            ),
            (
                "this node cut from the API server only",
                vec![healthy("c"), api_down("c")],
                &["a", "b", "c"],
                true,
            ),
            // `c` cut from its peers only: it hears nobody and stops; the others take its VIPs.
            (
                "this node cut from its peers",
                vec![healthy("c"), cut_from_peers("c")],
                &[],
                false,
            ),
            (
                "a peer cut from the others",
                vec![healthy("a"), others_without_c.clone()],
                &["a", "b"],
                true,
            ),
            // Cut from both: alone, and the count cannot shrink without the API server.
            (
                "this node cut from everything",
                vec![healthy("c"), {
                    let mut s = api_down("c");
                    s.members = Some(BTreeSet::new());
                    s
                }],
                &[],
                false,
            ),
            // Two halves of four: the one with the lowest name serves.
            (
                "split in halves, lowest side",
                vec![half("a", &["a", "b"])],
                &["a", "b"],
                true,
            ),
            (
                "split in halves, other side",
                vec![half("c", &["c", "d"])],
                // Its peer is alive in its view; it announces nothing itself, nor does `d`.
                &["d"],
                false,
            ),
            // A peer truly gone: stale Lease and no member: forgotten, so a 2-node cluster's survivor
            // serves alone once the Lease expired, whatever the names.
            (
                "two nodes, the lower-named one died",
                vec![{
                    let mut s = healthy("b");
                    s.lease_alive = BTreeSet::new();
                    s.members = Some(BTreeSet::new());
                    s.speaks_membership = set(&["a"]);
                    s
                }],
                &["b"],
                true,
            ),
            // Membership hears nobody here but the others hear each other: this node is cut off.
            (
                "nobody heard yet, others hear each other",
                vec![Signals {
                    heard_any: false,
                    ..cut_from_peers("c")
                }],
                &[],
                false,
            ),
            // Nobody hears anybody (the port blocked): the Leases decide.
            (
                "membership broken everywhere",
                vec![Signals {
                    heard_any: false,
                    hears_others: BTreeSet::new(),
                    ..cut_from_peers("c")
                }],
                &["a", "b", "c"],
                true,
            ),
            // Without membership: the Leases and this node's own renewals.
            (
                "membership off, API down",
                vec![Signals {
                    members: None,
                    ..api_down("a")
                }],
                &[],
                false,
            ),
            (
                "a peer without membership",
                vec![Signals {
                    speaks_membership: set(&["b"]),
                    members: Some(set(&["b"])),
                    ..healthy("a")
                }],
                &["a", "b", "c"],
                true,
            ),
        ];
        for (what, steps, alive, serving) in table {
            let judgement = run(&steps);
            assert_eq!(judgement.alive, set(alive), "{what}");
            assert_eq!(judgement.serving, serving, "{what}");
            assert_eq!(judgement.fenced_because.is_some(), !serving, "{what}");
        }
    }

    #[test]
    fn the_count_stands_while_the_api_server_is_away() {
        let mut judge = Judge::default();
        judge.judge(&healthy("a"));
        // The API server away from `a`, and `b` and `c` gone from its membership: alone among three.
        let mut alone = healthy("a");
        alone.self_fresh = false;
        alone.lease_alive = BTreeSet::new();
        alone.members = Some(BTreeSet::new());
        assert!(!judge.judge(&alone).serving);
        // Back to the API server, `b` and `c`'s Leases stale: they are forgotten, `a` serves alone.
        alone.self_fresh = true;
        assert!(judge.judge(&alone).serving);
    }

    #[test]
    fn every_side_of_a_split_agrees_on_who_serves() {
        // Five nodes split 3 / 2, and 2 / 2 / 1: at most one side serves, seen from every node.
        let names = ["a", "b", "c", "d", "e"];
        for sides in [
            vec![vec!["a", "b", "c"], vec!["d", "e"]],
            vec![vec!["d", "e", "a"], vec!["b", "c"]],
            vec![vec!["a", "e"], vec!["b", "c"], vec!["d"]],
        ] {
            let mut serving_sides = 0;
            for side in &sides {
                let serving: Vec<bool> = side
                    .iter()
                    .map(|me| {
                        let mut peers = set(&names);
                        peers.remove(*me);
                        let mut members = set(side);
                        members.remove(*me);
                        let s = Signals {
                            me: (*me).to_owned(),
                            self_fresh: true,
                            lease_alive: peers.clone(),
                            speaks_membership: peers.clone(),
                            hears_others: peers,
                            members: Some(members),
                            heard_any: true,
                        };
                        Judge::default().judge(&s).serving
                    })
                    .collect();
                assert!(serving.iter().all(|s| *s == serving[0]), "{sides:?}");
                serving_sides += usize::from(serving[0]);
            }
            assert!(serving_sides <= 1, "{sides:?}");
        }
    }
}
