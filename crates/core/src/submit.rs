//! Submission: requests become tasks. Every request of a call is validated (`request.rs`)
//! and planned (`plan.rs`) before any starts, so a bad one leaves no trace; then each task
//! starts its first attempt.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use crate::engine::Inner;
use crate::error::{Error, Result};
use crate::lanes::Lent;
use crate::lazy_now::LazyNow;
use crate::memory::Region;
use crate::plan::{plan, PeerView, Plan};
use crate::request::{Validate, ValidatedRequest};
use crate::segment::{Peer, SegmentDescriptor};
use crate::status::TransferStatus;
use crate::task::{Group, Observer, Task, TaskSnapshot, Told};
use crate::wake::Wake;

/// Requests of one call kept inline (no heap allocation) while validated and made tasks.
const INLINE_REQUESTS: usize = 4;

/// A call's validated and planned requests.
type Prepared = SmallVec<[(ValidatedRequest, Plan); INLINE_REQUESTS]>;
/// A call's new tasks.
type NewTasks = SmallVec<[Arc<Task>; INLINE_REQUESTS]>;

impl Inner {
    /// Validates and plans every request, as of the call's time `now`; the first bad one
    /// fails the call.
    fn prepare<R: Validate>(&self, requests: &[R], now: &LazyNow) -> Result<Prepared> {
        self.check_open()?;
        if requests.is_empty() {
            return Err(Error::InvalidArgument("no requests given".into()));
        }
        // The requests of one call mostly share a region and a segment (a block list
        // always does): each is looked up once per run of equal ids, not under the
        // tables' locks for every request. The descriptor is the one the run began with.
        let last_region: RefCell<Option<Lent<Region>>> = RefCell::default();
        let last_peer: RefCell<Option<(Lent<Peer>, Arc<SegmentDescriptor>)>> = RefCell::default();
        let region = |id| {
            if let Some(r) = last_region.borrow().as_ref().filter(|r| r.id() == id) {
                return Ok(r.clone());
            }
            let r = self.regions.lend(id)?;
            *last_region.borrow_mut() = Some(r.clone());
            Ok(r)
        };
        let segment = |handle| {
            if let Some(p) = last_peer
                .borrow()
                .as_ref()
                .filter(|(p, _)| p.handle() == handle)
            {
                return Ok(p.clone());
            }
            let peer = self.segments.lend(handle)?;
            let found = (peer.clone(), peer.descriptor());
            *last_peer.borrow_mut() = Some(found.clone());
            Ok(found)
        };
        requests
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let v = r.validate(region, segment).map_err(|e| annotate(e, i))?;
                let p = self.plan(&v, now).map_err(|e| annotate(e, i))?;
                Ok((v, p))
            })
            .collect()
    }

    /// The plan of a validated request, from what the engine knows of its peer now.
    fn plan(&self, v: &ValidatedRequest, now: &LazyNow) -> Result<Plan> {
        let registered = v
            .descriptor
            .buffer(v.remote_buffer)
            .map_or(&[][..], |b| &b.transports[..]);
        let path = |k| self.path(k, &v.peer);
        let peer = v.peer.handle();
        let dirty = self.health_dirty.load(Ordering::Relaxed);
        // The clock is read only if a failure was ever recorded (`health_dirty`).
        let paused = |k| dirty && self.health.is_paused(&(peer, k), now.get());
        let view = PeerView {
            name: v.peer.name(),
            buffer: v.remote_buffer,
            registered,
            path: &path,
            lost: v.peer.is_lost().then(|| v.peer.lost_error()),
            paused: &paused,
        };
        plan(v.hint, &view)
    }

    fn make_tasks(
        self: &Arc<Self>,
        prepared: Prepared,
        group: Option<&Arc<Group>>,
        observer: Observer,
        wake: Option<&Arc<Wake>>,
    ) -> NewTasks {
        let lane = self.stats.counters.lane();
        prepared
            .into_iter()
            .map(|(v, p)| {
                Task::new(
                    v,
                    Told {
                        group: group.cloned(),
                        wake: wake.cloned(),
                    },
                    lane.clone(),
                    observer,
                    p.candidates,
                    p.pinned,
                )
            })
            .collect()
    }

    /// Starts every task's first attempt; `now` is the call's time (attempt deadlines
    /// count from it: one clock read per call at most, not per task).
    fn launch(&self, tasks: &[Arc<Task>], now: &LazyNow) {
        self.stats.counters.submitted(tasks.len() as u64);
        for (i, task) in tasks.iter().enumerate() {
            match task.with_state(|st| st.candidates.first().copied()) {
                Some(kind) => self.start_attempt_in(task, kind, i + 1 < tasks.len(), now),
                // A plan is never empty; kept total all the same.
                None => {
                    task.fail(Error::TransportUnavailable("no candidate transport".into()));
                }
            }
        }
    }

    pub(crate) fn submit_transfer<R: Validate>(
        self: &Arc<Self>,
        batch: u64,
        requests: &[R],
    ) -> Result<usize> {
        self.submit_transfer_then(batch, requests, None)
    }

    /// `submit_transfer`, running `then` once every task of this submission has ended (a
    /// notification riding on it, `notify.rs`).
    pub(crate) fn submit_transfer_then<R: Validate>(
        self: &Arc<Self>,
        batch: u64,
        requests: &[R],
        then: Option<crate::notify::Then>,
    ) -> Result<usize> {
        self.check_open()?;
        let b = self.batches.get(batch).map_err(|e| self.or_closed(e))?;
        b.check_room(batch, requests.len())?;
        let now = LazyNow::new();
        let prepared = self.prepare(requests, &now)?;
        let count = prepared.len();
        let (holder, group) = match then.map(crate::notify::hook) {
            Some((holder, run)) => (Some(holder), Some(Group::new(count, run))),
            None => (None, None),
        };
        let tasks = self.make_tasks(prepared, group.as_ref(), Observer::Poll, Some(b.wake()));
        if let Some(holder) = holder {
            *holder.lock().unwrap_or_else(|p| p.into_inner()) = tasks.to_vec();
        }
        let first = b.push(batch, &tasks)?;
        self.launch(&tasks, &now);
        Ok(first)
    }

    pub(crate) fn transfer<R, F>(self: &Arc<Self>, requests: &[R], on_done: F) -> Result<u64>
    where
        R: Validate,
        F: FnOnce(Vec<TaskSnapshot>) + Send + 'static,
    {
        let now = LazyNow::new();
        let prepared = self.prepare(requests, &now)?;
        let op = self.next_op.fetch_add(1, Ordering::Relaxed);
        let weak = Arc::downgrade(self);
        let holder: Arc<Mutex<Vec<Arc<Task>>>> = Arc::default();
        let holder_cb = holder.clone();
        let group = Group::new(
            prepared.len(),
            Box::new(move || {
                let tasks =
                    std::mem::take(&mut *holder_cb.lock().unwrap_or_else(|p| p.into_inner()));
                if let Some(inner) = weak.upgrade() {
                    inner
                        .ops
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&op);
                }
                on_done(tasks.iter().map(|t| t.snapshot()).collect());
            }),
        );
        let tasks = self.make_tasks(prepared, Some(&group), Observer::Progress, None);
        *holder.lock().unwrap_or_else(|p| p.into_inner()) = tasks.to_vec();
        self.ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(op, holder);
        self.launch(&tasks, &now);
        Ok(op)
    }

    pub(crate) fn cancel(&self, op: u64) -> bool {
        let held = self
            .ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&op)
            .cloned();
        let Some(held) = held else { return false };
        let tasks = held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut any = false;
        for t in tasks {
            any |= t.finish(TransferStatus::Canceled, Some(Error::Canceled));
        }
        any
    }
}

/// Names the request an error is about.
fn annotate(e: Error, index: usize) -> Error {
    match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("request {index}: {m}")),
        Error::OutOfRange(m) => Error::OutOfRange(format!("request {index}: {m}")),
        Error::TransportUnavailable(m) => {
            Error::TransportUnavailable(format!("request {index}: {m}"))
        }
        other => other,
    }
}
