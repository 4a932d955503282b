//! Submission: requests become tasks. Every request of a call is validated (`request.rs`)
//! and planned (`plan.rs`) before any starts, so a bad one leaves no trace; then each task
//! starts its first attempt.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use crate::batch::{Batch, Entry};
use crate::error::{Error, Result};
use crate::inner::Inner;
use crate::lanes::Lent;
use crate::latency::{CallTimer, DoneInCall};
use crate::lazy_now::LazyNow;
use crate::memory::Region;
use crate::plan::{plan, PeerView, Plan};
use crate::request::{check_lone, Request, RequestView, Validate, ValidatedRequest};
use crate::segment::{Peer, SegmentDescriptor};
use crate::status::TransferStatus;
use crate::task::{Group, Lane, Observer, Task, TaskSnapshot, Told};
use crate::ticks::{self, Stamp};
use crate::wake::Wake;

/// Requests of one call kept inline (no heap allocation) while validated and made tasks.
const INLINE_REQUESTS: usize = 4;

/// A call's validated and planned requests.
type Prepared = SmallVec<[(ValidatedRequest, Plan); INLINE_REQUESTS]>;
/// A call's new tasks.
type NewTasks = SmallVec<[Arc<Task>; INLINE_REQUESTS]>;

impl Inner {
    /// Validates and plans every request, as of the call's time `now`; the first bad one
    /// fails the call. A buffer the segment's descriptor does not list is looked for once
    /// more after the descriptor was fetched again (`incarnations`): the peer may have
    /// allocated it since.
    fn prepare<R: Validate>(self: &Arc<Self>, requests: &[R], now: &LazyNow) -> Result<Prepared> {
        match self.prepare_all(requests, now) {
            Err(Error::UnknownBuffer { segment, .. }) if self.refresh_on_miss(&segment) => {
                self.prepare_all(requests, now)
            }
            prepared => prepared,
        }
    }

    fn prepare_all<R: Validate>(&self, requests: &[R], now: &LazyNow) -> Result<Prepared> {
        self.check_open()?;
        let lookup = |handle| {
            let peer = self.segments.lend(handle)?;
            let descriptor = peer.descriptor();
            Ok((peer, descriptor))
        };
        match requests {
            [] => Err(Error::InvalidArgument("no requests given".into())),
            // A poller's call, most often: looked up directly. Through the cache below, each
            // of the region, the peer and the descriptor would cost one more reference taken
            // and dropped (six atomic writes of a 4 KiB op's few dozen).
            [one] => Ok(smallvec::smallvec![self.prepare_one(
                0,
                one,
                |id| self.regions.lend(id),
                lookup,
                now
            )?]),
            _ => {
                // The requests of one call mostly share a region and a segment (a block
                // list always does): each is looked up once per run of equal ids, not under
                // the tables' locks for every request. The descriptor is the one the run
                // began with.
                let last_region: RefCell<Option<Lent<Region>>> = RefCell::default();
                let last_peer: RefCell<Option<(Lent<Peer>, Arc<SegmentDescriptor>)>> =
                    RefCell::default();
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
                    let found = lookup(handle)?;
                    *last_peer.borrow_mut() = Some(found.clone());
                    Ok(found)
                };
                requests
                    .iter()
                    .enumerate()
                    .map(|(i, r)| self.prepare_one(i, r, region, segment, now))
                    .collect()
            }
        }
    }

    /// Validates and plans request `index` of a call.
    fn prepare_one<R: Validate>(
        &self,
        index: usize,
        request: &R,
        region: impl Fn(crate::memory::RegionId) -> Result<Lent<Region>>,
        segment: impl Fn(u64) -> Result<(Lent<Peer>, Arc<SegmentDescriptor>)>,
        now: &LazyNow,
    ) -> Result<(ValidatedRequest, Plan)> {
        let mut v = request
            .validate(region, segment)
            .map_err(|e| annotate(e, index))?;
        v.verify |= self.config.verify;
        let p = self.plan(&v.view(), now).map_err(|e| annotate(e, index))?;
        Ok((v, p))
    }

    /// The plan of a validated request, from what the engine knows of its peer now.
    fn plan(&self, v: &RequestView<'_>, now: &LazyNow) -> Result<Plan> {
        let registered = v
            .descriptor
            .buffer(v.remote_buffer)
            .map_or(&[][..], |b| &b.transports[..]);
        let path = |k| self.path(k, v.peer);
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
        submitted_at: Stamp,
    ) -> NewTasks {
        let lane = self.stats.counters.lane();
        prepared
            .into_iter()
            .map(|one| make_task(one, &lane, group, observer, wake, submitted_at))
            .collect()
    }

    /// Has the first transport of `v`'s plan move it on this thread now, if it would
    /// anyway (`Transport::complete_now`); once it is done, counts it as a completed task
    /// is counted and returns its entry.
    fn complete_now(&self, v: &RequestView<'_>, p: &Plan, more_follow: bool) -> Option<Entry> {
        let transport = p.candidates.first().copied()?;
        if let Err(e) = self.transport(transport)?.complete_now(v, more_follow)? {
            // The attempt made next meets the same failure and fails over from it.
            tracing::debug!(peer = v.peer.name(), transport = transport.name(), error = %e, "copy at submission failed");
            return None;
        }
        let counters = &self.stats.counters;
        counters.completed_at_submit(transport, v.opcode, v.length);
        v.peer.series().completed(1, v.length);
        self.rail_succeeded(v.peer.handle(), transport);
        Some(Entry::Done {
            length: v.length,
            transport,
        })
    }

    /// A polled submission without a hook: each request whose first transport completes
    /// it on this thread at once (a same-host copy that stays inline) is done here and
    /// enters the batch done, costing no task, attempt, report or wake-up; the rest become
    /// tasks and start as in any submission. The copies run while the batch is held
    /// (`Batch::fill`), after its room was checked: a submission it refuses moves no byte.
    fn submit_polled(
        self: &Arc<Self>,
        batch: u64,
        b: &Batch,
        prepared: Prepared,
        now: &LazyNow,
    ) -> Result<usize> {
        let count = prepared.len();
        let counters = &self.stats.counters;
        let submitted_at = ticks::stamp();
        let timer = CallTimer::Timed {
            start: submitted_at,
            small: false,
        };
        let mut in_call = DoneInCall::default();
        let (first, (tasks, wake)) = b.fill(batch, count, |entries| {
            let mut tasks = NewTasks::new();
            let mut lane: Option<Arc<Lane>> = None;
            for (i, (v, p)) in prepared.into_iter().enumerate() {
                if let Some(done) = self.complete_now(&v.view(), &p, i + 1 < count) {
                    if let Entry::Done { transport, .. } = &done {
                        in_call.add(*transport, v.opcode);
                    }
                    entries.push(done);
                    continue;
                }
                let lane = lane.get_or_insert_with(|| counters.lane());
                let (observer, wake) = (Observer::Poll, Some(b.wake()));
                let task = make_task((v, p), lane, None, observer, wake, submitted_at);
                entries.push(Entry::Task(task.clone()));
                tasks.push(task);
            }
            // A waiter that came before this submission sleeps until something ends. Its
            // check takes this lock (`Wake::has_waiters`): read here, no fence.
            let wake = tasks.len() < count && b.wake().has_waiters();
            (tasks, wake)
        })?;
        in_call.record(counters.latency_local(), timer);
        if wake {
            b.wake().wake_all();
        }
        if !tasks.is_empty() {
            self.launch(&tasks, now);
        }
        Ok(first)
    }

    /// A lone polled request that the first transport of its plan completes on this thread
    /// at once (`complete_now`), checked and planned on the tables' own entries with no
    /// reference taken: region, peer and descriptor references taken and let go would cost
    /// a 4 KiB copy a tenth of its time. Runs under the batch table's lock (the batch's
    /// shard; taken before the region and segment tables' lanes and the batch's own lock,
    /// the order every path takes them in). Returns the index of its entry, entered done.
    /// `None` for anything else — a failed check or plan, a copy not made now, a full
    /// batch — which then goes the usual way (`prepare`, `submit_polled`), where its error
    /// or its task is made: this path ends only in success, so nothing fails differently.
    fn submit_lone_done(
        &self,
        batch: u64,
        b: &Batch,
        request: &Request,
        now: &LazyNow,
    ) -> Option<usize> {
        let span = request.span();
        let timer = CallTimer::lone(request.length);
        let mut in_call = DoneInCall::default();
        let done = self.regions.with_region(request.local, |local| {
            self.segments.with_peer(request.segment, |peer| {
                let descriptor = peer.descriptor_now();
                let mut view = check_lone(request, &span, local, peer, &descriptor).ok()?;
                view.verify |= self.config.verify;
                let plan = self.plan(&view, now).ok()?;
                // Copied while the batch is held, after its room was checked, as in
                // `submit_polled`: a submission it refuses moves no byte. Its waiters are
                // counted under the same lock (`Wake::has_waiters`).
                let (first, wake) = b
                    .fill(batch, 1, |entries| {
                        let done = self.complete_now(&view, &plan, false)?;
                        if let Entry::Done { transport, .. } = &done {
                            in_call.add(*transport, view.opcode);
                        }
                        entries.push(done);
                        Some(b.wake().has_waiters())
                    })
                    .ok()?;
                Some((first, wake?))
            })
        });
        let (first, wake) = done.flatten().flatten()?;
        in_call.record(self.stats.counters.latency_local(), timer);
        if wake {
            b.wake().wake_all();
        }
        Some(first)
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
        then: Option<crate::task::Then>,
    ) -> Result<usize> {
        self.check_open()?;
        let now = LazyNow::new();
        if let ([one], None) = (requests, &then) {
            // Under the batch table's lock, which finds the batch: no reference taken.
            let lone = |b: &Arc<Batch>| {
                b.check_room(batch, 1).ok()?;
                self.submit_lone_done(batch, b, one.one()?, &now)
            };
            if let Ok(Some(first)) = self.batches.with(batch, lone) {
                return Ok(first);
            }
        }
        let b = self.batches.get(batch).map_err(|e| self.or_closed(e))?;
        b.check_room(batch, requests.len())?;
        let prepared = self.prepare(requests, &now)?;
        let Some((holder, run)) = then.map(crate::task::hook) else {
            return self.submit_polled(batch, &b, prepared, &now);
        };
        let group = Group::new(prepared.len(), run);
        let wake = Some(b.wake());
        let tasks = self.make_tasks(prepared, Some(&group), Observer::Poll, wake, ticks::stamp());
        *holder.lock().unwrap_or_else(|p| p.into_inner()) = tasks.to_vec();
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
        // A lone request done at once (a same-host copy that stays inline) needs no task,
        // group or entry in the table of operations: its outcome is handed back now.
        if let [(v, p)] = &prepared[..] {
            let timer = CallTimer::lone(v.length);
            if let Some(done) = self.complete_now(&v.view(), p, false) {
                let mut in_call = DoneInCall::default();
                if let Entry::Done { transport, .. } = &done {
                    in_call.add(*transport, v.opcode);
                }
                in_call.record(self.stats.counters.latency_local(), timer);
                on_done(vec![done.snapshot()]);
                return Ok(op);
            }
        }
        let submitted_at = ticks::stamp();
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
        let tasks = self.make_tasks(
            prepared,
            Some(&group),
            Observer::Progress,
            None,
            submitted_at,
        );
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

/// A task for a validated and planned request, counted in `lane`.
fn make_task(
    (v, p): (ValidatedRequest, Plan),
    lane: &Arc<Lane>,
    group: Option<&Arc<Group>>,
    observer: Observer,
    wake: Option<&Arc<Wake>>,
    submitted_at: Stamp,
) -> Arc<Task> {
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
        submitted_at,
    )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Entry;
    use crate::engine::Engine;
    use crate::kind::{Opcode, TransportHint};
    use crate::metrics::{BytesBy, Metrics};
    use crate::{EngineConfig, Request, TransportKind};
    use std::time::{Duration, Instant};

    const KIB: u64 = 1024;

    /// Two engines on this host (shm and tcp), `len` bytes a side, the target's segment
    /// opened from the initiator. Both close when it drops.
    struct Rig {
        target: Engine,
        initiator: Engine,
        local: Arc<Region>,
        remote: Arc<Region>,
        seg: u64,
    }

    impl Rig {
        fn new(len: u64) -> Self {
            let config = || EngineConfig {
                transports: vec![TransportKind::Shm, TransportKind::Tcp],
                ..EngineConfig::default()
            };
            let target = Engine::new(config()).expect("target");
            let initiator = Engine::new(config()).expect("initiator");
            let remote = target.allocate(len).expect("remote");
            let local = initiator.allocate(len).expect("local");
            let seg = initiator
                .open_segment_blocking(target.segment_name())
                .expect("open")
                .handle;
            Self {
                target,
                initiator,
                local,
                remote,
                seg,
            }
        }

        /// A write of `length` bytes from `offset` of the local region to the same offset
        /// of the remote one.
        fn write(&self, offset: u64, length: u64, hint: TransportHint) -> Request {
            Request {
                opcode: Opcode::Write,
                local: self.local.id(),
                local_offset: offset,
                segment: self.seg,
                remote_buffer: self.remote.id(),
                remote_offset: offset,
                length,
                hint,
                verify: false,
            }
        }

        /// Which entries of `batch` were done at submission (no task).
        fn done_at_submit(&self, batch: u64) -> Vec<bool> {
            let b = self.initiator.inner().batch(batch).expect("batch");
            b.with_entries(|all| {
                all.iter()
                    .map(|e| matches!(e, Entry::Done { .. }))
                    .collect()
            })
        }

        /// Asserts that the remote region holds `byte` in `[offset, offset + len)` and
        /// zeros everywhere else.
        fn assert_landed_only(&self, offset: u64, len: u64, byte: u8) {
            let all = bytes(&self.remote, 0, self.remote.len() as u64);
            let (start, end) = (offset as usize, (offset + len) as usize);
            assert!(
                all[start..end].iter().all(|&b| b == byte),
                "not landed whole"
            );
            assert!(
                all[..start].iter().chain(&all[end..]).all(|&b| b == 0),
                "landed elsewhere"
            );
        }

        /// Asserts that the initiator counted one more completed task of `len` bytes since
        /// `before`, and nothing in flight; its metrics now.
        fn assert_counted_as_completed(&self, before: &Metrics, len: u64) -> Metrics {
            let after = self.initiator.metrics();
            assert_eq!(after.tasks_submitted, before.tasks_submitted + 1);
            assert_eq!(after.tasks_completed, before.tasks_completed + 1);
            assert_eq!(after.bytes_transferred, before.bytes_transferred + len);
            assert_eq!(after.inflight, 0);
            let timed = |m: &Metrics| m.latency.iter().map(|h| h.count()).sum::<u64>();
            assert_eq!(timed(&after), timed(before) + 1, "its duration recorded");
            let to_peer = |m: &Metrics| {
                m.peers
                    .iter()
                    .map(|p| (p.completed, p.bytes))
                    .fold((0, 0), |a, p| (a.0 + p.0, a.1 + p.1))
            };
            let (n, bytes) = to_peer(before);
            assert_eq!(
                to_peer(&after),
                (n + 1, bytes + len),
                "counted for its peer"
            );
            after
        }

        /// Polls `batch` until it ends (bounded); its snapshots.
        fn finish(&self, batch: u64) -> Vec<TaskSnapshot> {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !self
                .initiator
                .batch_status(batch)
                .expect("status")
                .status
                .is_terminal()
            {
                assert!(Instant::now() < deadline, "batch not done in 20 s");
                std::thread::yield_now();
            }
            self.initiator
                .transfer_status_list(batch)
                .expect("snapshots")
        }
    }

    impl Drop for Rig {
        fn drop(&mut self) {
            self.initiator.close();
            self.target.close();
        }
    }

    fn fill(region: &Region, offset: u64, len: u64, byte: u8) {
        let p = region.range_ptr(offset, len).expect("range");
        // SAFETY: the range was checked against the region, which the caller holds; no
        // transfer touches it meanwhile.
        unsafe { std::ptr::write_bytes(p, byte, len as usize) };
    }

    fn bytes(region: &Region, offset: u64, len: u64) -> Vec<u8> {
        let p = region.range_ptr(offset, len).expect("range");
        // SAFETY: as in `fill`; the copy reads the checked range once.
        unsafe { std::slice::from_raw_parts(p, len as usize) }.to_vec()
    }

    #[test]
    fn a_polled_same_host_copy_is_done_at_submit_and_reads_as_a_completed_task() {
        let rig = Rig::new(64 * KIB);
        fill(&rig.local, 0, 64 * KIB, 0x5a);
        let before = rig.initiator.metrics();
        let batch = rig.initiator.allocate_batch(1).expect("batch");
        let req = rig.write(8 * KIB, 4 * KIB, TransportHint::Require(TransportKind::Shm));
        assert_eq!(rig.initiator.submit_transfer(batch, &[req]), Ok(0));
        // Done before the call returned, without a task.
        assert_eq!(rig.done_at_submit(batch), [true]);
        let snap = rig.initiator.transfer_status(batch, 0).expect("status");
        assert_eq!(
            snap,
            TaskSnapshot {
                status: TransferStatus::Completed,
                transferred: 4 * KIB,
                length: 4 * KIB,
                transport: Some(TransportKind::Shm),
                attempts: 1,
                error: None,
            }
        );
        let agg = rig.initiator.batch_status(batch).expect("batch status");
        assert_eq!(
            (agg.status, agg.transferred, agg.tasks),
            (TransferStatus::Completed, 4 * KIB, 1)
        );
        let mut raw = [0u8; 2];
        assert_eq!(
            rig.initiator.transfer_status_into(batch, 0, &mut raw),
            Ok(1)
        );
        assert_eq!(raw[0], TransferStatus::Completed.raw());
        rig.assert_landed_only(8 * KIB, 4 * KIB, 0x5a);
        let after = rig.assert_counted_as_completed(&before, 4 * KIB);
        assert!(after.bytes_by.contains(&BytesBy {
            transport: TransportKind::Shm,
            op: Opcode::Write,
            bytes: 4 * KIB,
        }));
        rig.initiator.free_batch(batch).expect("free");
        assert!(rig.initiator.transfer_status(batch, 0).is_err(), "freed");
    }

    #[test]
    fn an_awaited_lone_same_host_copy_is_handed_back_before_the_call_returns() {
        let rig = Rig::new(64 * KIB);
        fill(&rig.local, 0, 64 * KIB, 0x77);
        let before = rig.initiator.metrics();
        let (tx, rx) = std::sync::mpsc::channel();
        let req = rig.write(16 * KIB, 8 * KIB, TransportHint::Auto);
        rig.initiator
            .transfer(&[req], move |snaps| tx.send(snaps).expect("send"))
            .expect("transfer");
        let snaps = rx.try_recv().expect("handed back during the call");
        assert_eq!(
            snaps,
            [TaskSnapshot {
                status: TransferStatus::Completed,
                transferred: 8 * KIB,
                length: 8 * KIB,
                transport: Some(TransportKind::Shm),
                attempts: 1,
                error: None,
            }]
        );
        rig.assert_landed_only(16 * KIB, 8 * KIB, 0x77);
        rig.assert_counted_as_completed(&before, 8 * KIB);
        assert!(rig.initiator.inner().ops.lock().expect("ops").is_empty());
    }

    #[test]
    fn a_call_keeps_its_order_when_some_requests_are_done_at_submit_and_others_are_tasks() {
        const BIG: u64 = 4 << 20;
        let rig = Rig::new(2 * BIG);
        fill(&rig.local, 0, 2 * BIG, 0xc3);
        let batch = rig.initiator.allocate_batch(4).expect("batch");
        let shm = TransportHint::Require(TransportKind::Shm);
        let requests = [
            rig.write(0, 4 * KIB, shm),
            // Another transport than the one that copies at once.
            rig.write(4 * KIB, 4 * KIB, TransportHint::Require(TransportKind::Tcp)),
            // Shared with the copy threads: a task.
            rig.write(BIG, BIG, shm),
            rig.write(8 * KIB, 4 * KIB, TransportHint::Auto),
        ];
        assert_eq!(rig.initiator.submit_transfer(batch, &requests), Ok(0));
        assert_eq!(rig.done_at_submit(batch), [true, false, false, true]);
        let snaps = rig.finish(batch);
        let seen: Vec<_> = snaps
            .iter()
            .map(|s| (s.status, s.transport, s.transferred))
            .collect();
        let done = TransferStatus::Completed;
        assert_eq!(
            seen,
            [
                (done, Some(TransportKind::Shm), 4 * KIB),
                (done, Some(TransportKind::Tcp), 4 * KIB),
                (done, Some(TransportKind::Shm), BIG),
                (done, Some(TransportKind::Shm), 4 * KIB),
            ]
        );
        assert!(bytes(&rig.remote, 0, 12 * KIB).iter().all(|&b| b == 0xc3));
        assert!(bytes(&rig.remote, BIG, BIG).iter().all(|&b| b == 0xc3));
        assert!(bytes(&rig.remote, 12 * KIB, 4 * KIB)
            .iter()
            .all(|&b| b == 0));
        rig.initiator.free_batch(batch).expect("free");
    }

    /// Submits `req` alone into a new batch of one; the call's outcome, and the batch
    /// (freed) with what it holds.
    fn submit_lone(rig: &Rig, req: Request) -> Result<Vec<TaskSnapshot>> {
        let batch = rig.initiator.allocate_batch(1).expect("batch");
        let outcome = rig.initiator.submit_transfer(batch, &[req]);
        let snaps = outcome.map(|_| rig.finish(batch));
        rig.initiator.free_batch(batch).expect("free");
        snaps
    }

    #[test]
    fn a_lone_polled_request_that_fails_a_check_fails_with_the_same_typed_error() {
        let rig = Rig::new(64 * KIB);
        fill(&rig.local, 0, 64 * KIB, 0x11);
        let before = rig.initiator.metrics();
        let shm = TransportHint::Require(TransportKind::Shm);
        let refused = |req: Request| submit_lone(&rig, req).expect_err("refused");
        let past_remote = Request {
            remote_offset: 60 * KIB,
            ..rig.write(0, 8 * KIB, shm)
        };
        let e = refused(past_remote);
        assert_eq!(e.code(), "ERR_FERRY_OUT_OF_RANGE");
        assert!(e.to_string().contains("request 0: remote buffer"), "{e}");
        let past_local = Request {
            local_offset: 64 * KIB,
            ..rig.write(0, 4 * KIB, shm)
        };
        let e = refused(past_local);
        assert_eq!(e.code(), "ERR_FERRY_OUT_OF_RANGE");
        assert!(e.to_string().contains("request 0: local region"), "{e}");
        let empty = rig.write(0, 0, TransportHint::Auto);
        assert_eq!(refused(empty).code(), "ERR_FERRY_INVALID_ARGUMENT");
        let no_region = Request {
            local: rig.local.id() + 1000,
            ..rig.write(0, 4 * KIB, shm)
        };
        assert_eq!(refused(no_region).code(), "ERR_FERRY_UNKNOWN_REGION");
        let no_segment = Request {
            segment: rig.seg + 1000,
            ..rig.write(0, 4 * KIB, shm)
        };
        assert_eq!(refused(no_segment).code(), "ERR_FERRY_UNKNOWN_SEGMENT");
        let no_buffer = Request {
            remote_buffer: rig.remote.id() + 1000,
            ..rig.write(0, 4 * KIB, shm)
        };
        assert_eq!(refused(no_buffer).code(), "ERR_FERRY_UNKNOWN_BUFFER");
        // Nothing moved, nothing counted.
        rig.assert_landed_only(0, 0, 0);
        let after = rig.initiator.metrics();
        assert_eq!(after.tasks_submitted, before.tasks_submitted);
        assert_eq!(after.bytes_transferred, before.bytes_transferred);
    }

    #[test]
    fn a_lone_polled_request_to_a_full_batch_is_refused_and_moves_nothing() {
        let rig = Rig::new(64 * KIB);
        fill(&rig.local, 0, 64 * KIB, 0x22);
        let batch = rig.initiator.allocate_batch(1).expect("batch");
        let shm = TransportHint::Require(TransportKind::Shm);
        let first = rig.write(0, 4 * KIB, shm);
        assert_eq!(rig.initiator.submit_transfer(batch, &[first]), Ok(0));
        let second = rig.write(32 * KIB, 4 * KIB, shm);
        let e = rig
            .initiator
            .submit_transfer(batch, &[second])
            .expect_err("full");
        assert_eq!(e.code(), "ERR_FERRY_BATCH_FULL");
        rig.assert_landed_only(0, 4 * KIB, 0x22);
        rig.initiator.free_batch(batch).expect("free");
    }

    #[test]
    fn a_lone_polled_request_whose_shm_target_died_fails_over_or_fails_typed() {
        let rig = Rig::new(64 * KIB);
        fill(&rig.local, 0, 64 * KIB, 0x33);
        let inner = rig.initiator.inner();
        let peer = inner.segments.get(rig.seg).expect("peer");
        let shm = inner.transport(TransportKind::Shm).expect("shm");
        shm.fail_peer(&peer, Error::Closed);
        // Required: refused at submission, with why.
        let required = rig.write(0, 4 * KIB, TransportHint::Require(TransportKind::Shm));
        let e = submit_lone(&rig, required).expect_err("refused");
        assert_eq!(e.code(), "ERR_FERRY_TRANSPORT_UNAVAILABLE");
        assert!(e.to_string().contains("process exited"), "{e}");
        // Any transport: carried by tcp, a task.
        let auto = rig.write(8 * KIB, 4 * KIB, TransportHint::Auto);
        let snaps = submit_lone(&rig, auto).expect("submitted");
        let seen: Vec<_> = snaps.iter().map(|s| (s.status, s.transport)).collect();
        assert_eq!(
            seen,
            [(TransferStatus::Completed, Some(TransportKind::Tcp))]
        );
        rig.assert_landed_only(8 * KIB, 4 * KIB, 0x33);
    }

    #[test]
    fn a_waiter_asleep_before_the_submission_wakes_when_it_is_done_at_submit() {
        let rig = Rig::new(64 * KIB);
        let batch = rig.initiator.allocate_batch(1).expect("batch");
        let b = rig.initiator.inner().batch(batch).expect("batch");
        let engine = rig.initiator.clone();
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            let snap = engine.wait_batch(batch, Duration::from_secs(30));
            (snap.map(|s| s.status), started.elapsed())
        });
        // Submitted once the waiter is asleep (or about to be, under the wake's lock).
        let deadline = Instant::now() + Duration::from_secs(20);
        while b.wake().waiting() == 0 {
            assert!(Instant::now() < deadline, "the waiter never waited");
            std::thread::yield_now();
        }
        let req = rig.write(0, 4 * KIB, TransportHint::Require(TransportKind::Shm));
        rig.initiator
            .submit_transfer(batch, &[req])
            .expect("submit");
        assert_eq!(rig.done_at_submit(batch), [true]);
        let (status, waited) = waiter.join().expect("waiter");
        assert_eq!(status, Ok(TransferStatus::Completed));
        assert!(
            waited < Duration::from_secs(15),
            "woken by its deadline, not the copy: {waited:?}"
        );
        rig.initiator.free_batch(batch).expect("free");
    }
}
