//! Planning: which transports may serve a request, best first, or the typed reason none
//! can. Pure: the engine gathers a [`PeerView`] at submit time.
//!
//! Everything a transport hint, a requirement, a lost peer, a paused rail or an
//! unreachable path means for the choice is decided here and only here:
//! - `Require(k)` yields exactly `[k]` (pinned: no failover), or an error that says why `k`
//!   cannot serve (not enabled here, not registered by the target, unreachable, peer lost).
//! - `Prefer(k)` puts `k` first when it can serve, and is otherwise ignored (but a hint
//!   the target did not register is refused: it names a transport that can never serve).
//! - Otherwise the candidates are the transports both usable from here and registered by
//!   the target, in [`DEFAULT_ORDER`], those with a paused rail moved last.

use std::borrow::Cow;
use std::cell::OnceCell;

use crate::error::{Error, Result};
use crate::kind::{Kinds, TransportHint, TransportKind, BY_INDEX, DEFAULT_ORDER};

/// One transport's state towards the peer, from here.
///
/// Its messages are borrowed when they can be: paths are asked for every request, and a
/// message shared by every thread would cost a reference count written per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Path<'a> {
    /// It can carry requests to the peer now.
    Usable,
    /// Not enabled on this engine (the message says why, e.g. "rdma is disabled on this
    /// engine: no RDMA device").
    NotEnabled(Cow<'a, str>),
    /// Enabled here, but it cannot reach this peer (e.g. shm towards another host).
    Unreachable(Cow<'a, str>),
    /// Enabled here, but setting it up towards this peer ran out of a resource (the
    /// message names the limit): a request that requires it fails `ResourceLimit`.
    Exhausted(Cow<'a, str>),
}

impl Path<'_> {
    /// Why it cannot serve, when it cannot.
    pub(crate) fn why_not(&self) -> Option<&str> {
        match self {
            Self::Usable => None,
            Self::NotEnabled(why) | Self::Unreachable(why) | Self::Exhausted(why) => Some(why),
        }
    }
}

/// What the planner is told about the peer of a request.
pub(crate) struct PeerView<'a> {
    /// Segment name, for messages.
    pub(crate) name: &'a str,
    /// The remote buffer, for messages.
    pub(crate) buffer: u64,
    /// Transports the target registered the remote buffer with.
    pub(crate) registered: &'a [TransportKind],
    /// Each transport's path to the peer.
    pub(crate) path: &'a dyn Fn(TransportKind) -> Path<'a>,
    /// The peer's loss (its typed error), while it is declared lost.
    pub(crate) lost: Option<Error>,
    /// Whether the (peer, transport) rail is paused now (asked only when the choice
    /// depends on it; the engine reads the clock only then).
    pub(crate) paused: &'a dyn Fn(TransportKind) -> bool,
}

/// The candidates of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Best first; never empty.
    pub(crate) candidates: Kinds,
    /// Whether only `candidates[0]` may serve (no failover).
    pub(crate) pinned: bool,
}

/// Plans a request with `hint` towards the peer of `view`.
pub(crate) fn plan(hint: TransportHint, view: &PeerView<'_>) -> Result<Plan> {
    // Each path asked once at most, and only when needed: a requirement asks only its own
    // (asking may take a transport's lock, and runs for every request).
    let paths: [OnceCell<Path<'_>>; BY_INDEX.len()] = Default::default();
    let path = |k: TransportKind| paths[k.index()].get_or_init(|| (view.path)(k));
    if let TransportHint::Require(k) = hint {
        // Not usable here at all: say so first (the target not offering it either is the
        // lesser news).
        if let Path::NotEnabled(why) = path(k) {
            return Err(Error::TransportUnavailable(format!("{k} required: {why}")));
        }
    }
    if let Some(k) = hint.kind() {
        if !view.registered.contains(&k) {
            return Err(Error::TransportUnavailable(format!(
                "remote buffer {} is not registered with {k}",
                view.buffer
            )));
        }
    }
    if let TransportHint::Require(k) = hint {
        let exhausted = matches!(path(k), Path::Exhausted(_));
        if let Some(why) = path(k).why_not() {
            return Err(view.lost.clone().unwrap_or_else(|| {
                let why = format!("{k} required but unavailable towards {}: {why}", view.name);
                if exhausted {
                    Error::ResourceLimit(why)
                } else {
                    Error::TransportUnavailable(why)
                }
            }));
        }
        return Ok(Plan {
            candidates: [k].into_iter().collect(),
            pinned: true,
        });
    }
    let usable: Kinds = DEFAULT_ORDER
        .into_iter()
        .filter(|k| *path(*k) == Path::Usable)
        .collect();
    let mut candidates: Kinds = usable
        .iter()
        .copied()
        .filter(|k| view.registered.contains(k))
        .collect();
    if candidates.is_empty() {
        // Nothing reachable because the peer died: say that, not "no transport".
        return Err(view.lost.clone().unwrap_or_else(|| {
            Error::TransportUnavailable(format!(
                "target registered {:?}, this engine enables {usable:?}",
                view.registered
            ))
        }));
    }
    // Healthy rails first, paused ones as a last resort; order kept within each group.
    candidates.sort_by_key(|k| (view.paused)(*k));
    if let TransportHint::Prefer(k) = hint {
        if let Some(i) = candidates.iter().position(|c| *c == k) {
            candidates[..=i].rotate_right(1);
        }
    }
    Ok(Plan {
        candidates,
        pinned: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use TransportKind::*;

    /// A peer as the tests describe it.
    struct Peer {
        registered: Vec<TransportKind>,
        paths: HashMap<TransportKind, Path<'static>>,
        lost: bool,
        paused: Vec<TransportKind>,
    }

    impl Peer {
        fn new(registered: &[TransportKind]) -> Self {
            Self {
                registered: registered.to_vec(),
                paths: DEFAULT_ORDER.iter().map(|k| (*k, Path::Usable)).collect(),
                lost: false,
                paused: Vec::new(),
            }
        }
        fn with(mut self, k: TransportKind, p: Path<'static>) -> Self {
            self.paths.insert(k, p);
            self
        }
        fn plan(&self, hint: TransportHint) -> Result<Plan> {
            let path = |k| self.paths[&k].clone();
            let paused = |k| self.paused.contains(&k);
            let view = PeerView {
                name: "10.0.0.2:7000",
                buffer: 3,
                registered: &self.registered,
                path: &path,
                lost: self.lost.then(|| Error::PeerLost {
                    peer: "10.0.0.2:7000".into(),
                    reason: crate::liveness::LossReason::Silent { timeout_ms: 3000 },
                }),
                paused: &paused,
            };
            plan(hint, &view)
        }
    }

    #[test]
    fn each_path_is_asked_at_most_once_and_a_requirement_asks_only_its_own() {
        let asked = std::cell::RefCell::new(Vec::new());
        let path = |k| {
            asked.borrow_mut().push(k);
            Path::Usable
        };
        let paused = |_| false;
        let view = PeerView {
            name: "10.0.0.2:7000",
            buffer: 3,
            registered: &DEFAULT_ORDER,
            path: &path,
            lost: None,
            paused: &paused,
        };
        let pinned = plan(TransportHint::Require(Shm), &view).expect("plan");
        assert_eq!(pinned.candidates.to_vec(), [Shm]);
        assert_eq!(*asked.borrow(), [Shm]);
        asked.borrow_mut().clear();
        let auto = plan(TransportHint::Auto, &view).expect("plan");
        assert_eq!(auto.candidates.len(), DEFAULT_ORDER.len());
        let mut seen = asked.borrow().clone();
        seen.sort_by_key(|k| k.index());
        seen.dedup();
        assert_eq!(seen.len(), asked.borrow().len(), "a path asked twice");
        assert_eq!(seen.len(), DEFAULT_ORDER.len());
    }

    fn ok(p: Result<Plan>) -> (Vec<TransportKind>, bool) {
        let p = p.expect("a plan");
        (p.candidates.to_vec(), p.pinned)
    }

    fn code(p: Result<Plan>) -> (&'static str, String) {
        let e = p.expect_err("no plan");
        (e.code(), e.to_string())
    }

    fn off(why: &str) -> Path<'static> {
        Path::NotEnabled(why.to_string().into())
    }

    fn far(why: &str) -> Path<'static> {
        Path::Unreachable(why.to_string().into())
    }

    #[test]
    fn auto_takes_the_default_order_of_what_both_sides_have() {
        let all = Peer::new(&[Tcp, Shm, Rdma]);
        assert_eq!(
            ok(all.plan(TransportHint::Auto)),
            (vec![Shm, Rdma, Tcp], false)
        );
        let tcp_shm = Peer::new(&[Tcp, Shm]);
        assert_eq!(
            ok(tcp_shm.plan(TransportHint::Auto)),
            (vec![Shm, Tcp], false)
        );
        let no_rdma_here = Peer::new(&[Tcp, Rdma]).with(Rdma, off("rdma is disabled"));
        assert_eq!(
            ok(no_rdma_here.plan(TransportHint::Auto)),
            (vec![Tcp], false)
        );
        let remote_host = Peer::new(&[Tcp, Shm]).with(Shm, far("another host"));
        assert_eq!(
            ok(remote_host.plan(TransportHint::Auto)),
            (vec![Tcp], false)
        );
    }

    #[test]
    fn a_required_transport_that_ran_out_of_a_resource_fails_with_the_limit() {
        let limit = "memory: mmap of 1073741824 bytes failed: ENOMEM";
        let p = Peer::new(&[Tcp, Shm]).with(Shm, Path::Exhausted(limit.into()));
        let (c, m) = code(p.plan(TransportHint::Require(Shm)));
        assert_eq!(c, "ERR_FERRY_RESOURCE_LIMIT");
        assert!(m.contains(limit), "{m}");
        // Anything else goes where it can, as for any path that cannot serve.
        assert_eq!(ok(p.plan(TransportHint::Auto)), (vec![Tcp], false));
        assert_eq!(ok(p.plan(TransportHint::Prefer(Shm))), (vec![Tcp], false));
    }

    #[test]
    fn nothing_in_common_is_unavailable_or_the_loss() {
        let p = Peer::new(&[Shm]).with(Shm, far("another host"));
        let (c, m) = code(p.plan(TransportHint::Auto));
        assert_eq!(c, "ERR_FERRY_TRANSPORT_UNAVAILABLE");
        assert!(m.contains("target registered [Shm]"), "{m}");
        let mut lost = Peer::new(&[Tcp]).with(Tcp, far("down"));
        lost.lost = true;
        assert_eq!(
            code(lost.plan(TransportHint::Auto)).0,
            "ERR_FERRY_PEER_LOST"
        );
        // A lost peer whose paths still look usable is planned: the attempt then fails
        // with the loss (the engine fails work towards a lost peer at once).
        let mut usable = Peer::new(&[Tcp]);
        usable.lost = true;
        assert_eq!(ok(usable.plan(TransportHint::Auto)), (vec![Tcp], false));
    }

    #[test]
    fn prefer_goes_first_when_it_can_serve_and_is_ignored_otherwise() {
        let all = Peer::new(&[Tcp, Shm, Rdma]);
        assert_eq!(
            ok(all.plan(TransportHint::Prefer(Tcp))),
            (vec![Tcp, Shm, Rdma], false)
        );
        let far_shm = Peer::new(&[Tcp, Shm]).with(Shm, far("another host"));
        assert_eq!(
            ok(far_shm.plan(TransportHint::Prefer(Shm))),
            (vec![Tcp], false)
        );
        let off_rdma = Peer::new(&[Tcp, Rdma]).with(Rdma, off("no device"));
        assert_eq!(
            ok(off_rdma.plan(TransportHint::Prefer(Rdma))),
            (vec![Tcp], false)
        );
        // A hint the target never registered can never serve: refused.
        let (c, m) = code(Peer::new(&[Tcp]).plan(TransportHint::Prefer(Rdma)));
        assert_eq!(c, "ERR_FERRY_TRANSPORT_UNAVAILABLE");
        assert_eq!(
            m,
            "no transport available: remote buffer 3 is not registered with rdma"
        );
    }

    #[test]
    fn require_is_exactly_one_transport_or_why_not() {
        for k in DEFAULT_ORDER {
            let p = Peer::new(&DEFAULT_ORDER);
            assert_eq!(ok(p.plan(TransportHint::Require(k))), (vec![k], true));
        }
        // Not enabled here wins over not registered there.
        let p =
            Peer::new(&[Tcp]).with(Rdma, off("rdma is disabled on this engine: no RDMA device"));
        let (c, m) = code(p.plan(TransportHint::Require(Rdma)));
        assert_eq!(c, "ERR_FERRY_TRANSPORT_UNAVAILABLE");
        assert!(
            m.contains("rdma required: rdma is disabled on this engine: no RDMA device"),
            "{m}"
        );
        let (c, m) = code(Peer::new(&[Tcp]).plan(TransportHint::Require(Shm)));
        assert_eq!(c, "ERR_FERRY_TRANSPORT_UNAVAILABLE");
        assert!(m.contains("not registered with shm"), "{m}");
        let p = Peer::new(&[Tcp, Shm]).with(Shm, far("segment is on another host"));
        let (c, m) = code(p.plan(TransportHint::Require(Shm)));
        assert_eq!(c, "ERR_FERRY_TRANSPORT_UNAVAILABLE");
        assert!(
            m.contains(
                "shm required but unavailable towards 10.0.0.2:7000: segment is on another host"
            ),
            "{m}"
        );
        // Unreachable because the peer is lost: the loss is the news.
        let mut lost = Peer::new(&[Tcp]).with(Tcp, far("connection refused"));
        lost.lost = true;
        assert_eq!(
            code(lost.plan(TransportHint::Require(Tcp))).0,
            "ERR_FERRY_PEER_LOST"
        );
        // A paused rail does not matter to a requirement.
        let mut paused = Peer::new(&[Tcp, Shm]);
        paused.paused = vec![Shm];
        assert_eq!(
            ok(paused.plan(TransportHint::Require(Shm))),
            (vec![Shm], true)
        );
    }

    #[test]
    fn paused_rails_go_last_but_stay_and_a_preference_stays_first() {
        let mut p = Peer::new(&[Tcp, Shm, Rdma]);
        p.paused = vec![Shm];
        assert_eq!(
            ok(p.plan(TransportHint::Auto)),
            (vec![Rdma, Tcp, Shm], false)
        );
        p.paused = vec![Shm, Rdma, Tcp];
        assert_eq!(
            ok(p.plan(TransportHint::Auto)),
            (vec![Shm, Rdma, Tcp], false)
        );
        p.paused = vec![Tcp];
        assert_eq!(
            ok(p.plan(TransportHint::Prefer(Tcp))),
            (vec![Tcp, Shm, Rdma], false)
        );
        p.paused = vec![Shm];
        assert_eq!(
            ok(p.plan(TransportHint::Prefer(Shm))),
            (vec![Shm, Rdma, Tcp], false)
        );
    }

    #[test]
    fn the_whole_table_holds_its_invariants() {
        // Every combination of registration, path and pause for the three transports,
        // with every hint and lost or not.
        let paths = [Path::Usable, off("off"), far("far")];
        let hints: Vec<TransportHint> = std::iter::once(TransportHint::Auto)
            .chain(DEFAULT_ORDER.iter().map(|k| TransportHint::Prefer(*k)))
            .chain(DEFAULT_ORDER.iter().map(|k| TransportHint::Require(*k)))
            .collect();
        let mut planned = 0;
        for reg_bits in 0..8u8 {
            for path_idx in 0..27usize {
                for pause_bits in 0..8u8 {
                    for lost in [false, true] {
                        let pick = |bits: u8| -> Vec<TransportKind> {
                            DEFAULT_ORDER
                                .iter()
                                .enumerate()
                                .filter(|(i, _)| bits & (1 << i) != 0)
                                .map(|(_, k)| *k)
                                .collect()
                        };
                        let mut p = Peer::new(&pick(reg_bits));
                        let mut idx = path_idx;
                        for k in DEFAULT_ORDER {
                            p = p.with(k, paths[idx % 3].clone());
                            idx /= 3;
                        }
                        p.paused = pick(pause_bits);
                        p.lost = lost;
                        for hint in &hints {
                            match p.plan(*hint) {
                                Ok(plan) => {
                                    planned += 1;
                                    assert!(!plan.candidates.is_empty());
                                    for k in plan.candidates.iter() {
                                        assert!(p.registered.contains(k), "{hint:?}");
                                        assert_eq!(p.paths[k], Path::Usable, "{hint:?}");
                                    }
                                    match hint {
                                        TransportHint::Require(k) => {
                                            assert!(plan.pinned);
                                            assert_eq!(&*plan.candidates, &[*k]);
                                        }
                                        TransportHint::Prefer(k) => {
                                            assert!(!plan.pinned);
                                            if p.paths[k] == Path::Usable {
                                                assert_eq!(plan.candidates[0], *k);
                                            }
                                        }
                                        TransportHint::Auto => assert!(!plan.pinned),
                                    }
                                }
                                Err(e) => {
                                    let c = e.code();
                                    assert!(
                                        c == "ERR_FERRY_TRANSPORT_UNAVAILABLE"
                                            || (lost && c == "ERR_FERRY_PEER_LOST"),
                                        "{hint:?}: {e}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(planned > 1000, "{planned}");
    }
}
