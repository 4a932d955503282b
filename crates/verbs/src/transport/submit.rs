//! Submitting an attempt: its slices spread over the peer's live endpoints and pushed to
//! them. The shell looks up the registrations and pushes; which endpoint a slice goes to
//! and what a refused push means are decided by the pure functions below it.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use ferry_core::transport::Attempt;
use ferry_core::{Error, Opcode, Result};

use super::endpoint::{PushError, Work};
use super::verify::PendingCheck;
use super::Shared;
use crate::provider::WrOpcode;

impl Shared {
    /// Slices one attempt over the peer's live endpoints, round robin from the link's
    /// next start, and posts them (or queues them behind `max_outstanding`).
    ///
    /// # Errors
    /// `TransportUnavailable` when nothing of the attempt went out (no live endpoint, an
    /// unregistered region or buffer, every push refused): the engine tries the next
    /// transport. Once a slice is on the wire a refusal fails the attempt instead.
    pub(super) fn submit_one(self: &Arc<Self>, a: &Attempt) -> Result<()> {
        let req = a.task.request();
        let unavailable = |why: String| Error::TransportUnavailable(format!("rdma: {why}"));
        let link = self
            .link(req.peer.handle())
            .ok_or_else(|| unavailable(format!("no endpoint to {}", req.peer.name())))?;
        // The endpoints and the registrations reach one incarnation of the peer: a request
        // planned against another goes elsewhere (the new one not set up yet) or nowhere
        // (planned against one that is gone).
        if link.engine_id.load(Ordering::Acquire) != req.descriptor.engine_id {
            if req.descriptor.engine_id == req.peer.engine_id() {
                return Err(unavailable(format!(
                    "endpoints to the new incarnation of {} are not up yet",
                    req.peer.name()
                )));
            }
            return Err(req.peer.restarted_error());
        }
        let eps = link.live();
        if eps.is_empty() {
            return Err(unavailable(format!(
                "no connected endpoint to {}: {}",
                req.peer.name(),
                link.down_reason()
            )));
        }
        let local = self
            .regions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&req.local.id())
            .cloned()
            .ok_or_else(|| unavailable(format!("region {} is not registered", req.local.id())))?;
        let remote = link
            .remote_mr(&req.descriptor, req.remote_buffer)
            .ok_or_else(|| {
                unavailable(format!(
                    "buffer {} of {} has no rdma registration",
                    req.remote_buffer,
                    req.peer.name()
                ))
            })?;
        let slice = self.config.slice_size as u64;
        let slices_u32 = u32::try_from(req.slice_count(slice))
            .ok()
            .filter(|n| *n < u32::MAX)
            .ok_or_else(|| Error::InvalidArgument("request has too many slices".into()))?;
        // A verified attempt ends with its check, one slice more than it posts.
        let check = req
            .verify
            .then(|| Arc::new(PendingCheck::new(slices_u32, remote.addr, local.clone())));
        let opcode = wr_opcode(req.opcode);
        let local_base = local.region.as_ptr() as u64;
        let start = link.next.fetch_add(1, Ordering::Relaxed) as usize;
        let mut per_ep: Vec<Vec<Work>> = (0..eps.len()).map(|_| Vec::new()).collect();
        for (i, piece) in req.slices(slice).enumerate() {
            let e = endpoint_for(start, i, eps.len());
            let ep = &eps[e];
            let (Some(mr), Some(rkey)) =
                (local.mrs.get(ep.local_dev), remote.rkeys.get(ep.remote_dev))
            else {
                return Err(unavailable("device index out of range".into()));
            };
            let starts_share = per_ep[e].is_empty();
            per_ep[e].push(Work {
                task: a.task.clone(),
                attempt: a.attempt,
                opcode,
                local_addr: local_base + piece.local_offset,
                lkey: mr.lkey(),
                // A slice is at most `slice_size`, a u32.
                len: piece.length as u32,
                remote_addr: remote.addr.wrapping_add(piece.remote_offset),
                rkey: *rkey,
                local: local.clone(),
                starts_share,
                check: check.clone(),
            });
        }
        a.task
            .expect_slices(a.attempt, slices_u32 + u32::from(check.is_some()));
        let shares = per_ep.iter().filter(|w| !w.is_empty()).count();
        if shares > 1 {
            // Its deadline runs once every endpoint posted some of it.
            a.task.expect_shares(a.attempt, shares as u32);
        }
        let mut pushed_any = false;
        for (ep, works) in eps.iter().zip(per_ep) {
            if works.is_empty() {
                continue;
            }
            match ep.push(works) {
                Ok(()) => pushed_any = true,
                Err(err) => {
                    let Refusal {
                        why,
                        reset,
                        posted_any,
                    } = refusal(err, pushed_any);
                    if reset {
                        self.reset_endpoint(&link, ep, &why, || {
                            Error::Io(format!("rdma endpoint reset: {why}"))
                        });
                    }
                    if !posted_any {
                        return Err(unavailable(why));
                    }
                    a.task
                        .attempt_failed(a.attempt, Error::Io(format!("rdma: {why}")));
                    break;
                }
            }
        }
        self.wake_poller();
        Ok(())
    }
}

/// The work request opcode of a transfer's direction.
fn wr_opcode(op: Opcode) -> WrOpcode {
    match op {
        Opcode::Write => WrOpcode::RdmaWrite,
        Opcode::Read => WrOpcode::RdmaRead,
    }
}

/// The endpoint (of `endpoints`) that slice `i` goes to: round robin from `start`, which
/// each request of a link takes in turn, so small requests spread over the endpoints too.
fn endpoint_for(start: usize, i: usize, endpoints: usize) -> usize {
    (start + i) % endpoints
}

/// What follows a push an endpoint refused.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    /// Why, for the errors and the log.
    why: String,
    /// Whether the endpoint must be reset: a failed post leaves its queue pair unusable; a
    /// broken endpoint has been reset already.
    reset: bool,
    /// Whether any slice of the attempt is on the wire: then the attempt fails (and fails
    /// over once those end); otherwise the submit fails and nothing went out.
    posted_any: bool,
}

/// Judges `err`, refused after earlier endpoints took slices of the attempt
/// (`posted_before`) or not.
fn refusal(err: PushError, posted_before: bool) -> Refusal {
    match err {
        PushError::Broken(why) => Refusal {
            why,
            reset: false,
            posted_any: posted_before,
        },
        PushError::Post { error, posted_any } => Refusal {
            why: format!("post_send failed: {error}"),
            reset: true,
            posted_any: posted_before || posted_any,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::VerbsError;

    #[test]
    fn slices_go_round_robin_from_the_start() {
        let spread: Vec<usize> = (0..5).map(|i| endpoint_for(2, i, 3)).collect();
        assert_eq!(spread, [2, 0, 1, 2, 0]);
        assert_eq!(endpoint_for(usize::MAX - 1, 0, 4), (usize::MAX - 1) % 4);
        assert_eq!(endpoint_for(7, 0, 1), 0);
    }

    #[test]
    fn directions_map_to_their_opcodes() {
        assert_eq!(wr_opcode(Opcode::Write), WrOpcode::RdmaWrite);
        assert_eq!(wr_opcode(Opcode::Read), WrOpcode::RdmaRead);
    }

    #[test]
    fn a_broken_endpoint_is_not_reset_again() {
        let r = refusal(PushError::Broken("reset earlier".into()), false);
        assert_eq!(
            r,
            Refusal {
                why: "reset earlier".into(),
                reset: false,
                posted_any: false,
            }
        );
        assert!(refusal(PushError::Broken("x".into()), true).posted_any);
    }

    #[test]
    fn a_failed_post_resets_and_counts_what_went_out_before_it() {
        let post = |posted_any| PushError::Post {
            error: VerbsError::errno("ibv_post_send", 12, "no room"),
            posted_any,
        };
        let r = refusal(post(false), false);
        assert!(r.reset);
        assert!(!r.posted_any, "nothing went out: the submit fails");
        assert!(
            r.why.starts_with("post_send failed: ibv_post_send failed"),
            "{}",
            r.why
        );
        assert!(
            refusal(post(true), false).posted_any,
            "this push posted some"
        );
        assert!(
            refusal(post(false), true).posted_any,
            "an earlier endpoint took some"
        );
    }
}
