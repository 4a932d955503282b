//! One connected queue pair towards a peer, with its completion queue, the table of
//! posted slices (the work request id is the slot index) and a backlog for slices beyond
//! the outstanding limit.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ferry_core::fence::Landing;
use ferry_core::task::Task;

use super::verify::PendingCheck;
use super::LocalMr;
use crate::provider::{CompletionQueue, QueuePair, SendWr, Sge, VerbsError, WrOpcode};

/// One slice waiting to be posted.
pub(crate) struct Work {
    pub task: Arc<Task>,
    pub attempt: u32,
    pub opcode: WrOpcode,
    pub local_addr: u64,
    pub lkey: u32,
    pub len: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Keeps the local registration (and so the memory) alive until the slice ends.
    pub local: Arc<LocalMr>,
    /// The first slice of its attempt's share for this endpoint: posting it starts the
    /// attempt's deadline (`Task::started`).
    pub starts_share: bool,
    /// A verified attempt's check, which runs once its last work request completed.
    pub check: Option<Arc<PendingCheck>>,
}

/// A posted slice.
pub(crate) struct Slot {
    pub task: Arc<Task>,
    pub attempt: u32,
    pub bytes: u32,
    pub posted: Instant,
    /// A verified attempt's check (`Work::check`).
    pub check: Option<Arc<PendingCheck>>,
    _local: Arc<LocalMr>,
    /// Holds the task's fence until the completion is taken or the QP was moved to ERR
    /// and the slot dropped (`break_all`): a cancel settles only after that.
    _landing: Landing<Task>,
}

#[derive(Default)]
struct State {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    backlog: VecDeque<Work>,
    broken: Option<String>,
}

/// A connected RC queue pair.
pub(crate) struct Endpoint {
    /// Which of the peer's endpoints this is.
    pub slot: u32,
    /// Local device index.
    pub local_dev: usize,
    /// Remote device index (selects the rkey).
    pub remote_dev: usize,
    // Field order matters: the QP must be destroyed before its CQ.
    pub qp: Arc<dyn QueuePair>,
    pub cq: Arc<dyn CompletionQueue>,
    max_outstanding: u32,
    outstanding: AtomicU32,
    state: Mutex<State>,
}

impl Endpoint {
    pub(crate) fn new(
        slot: u32,
        local_dev: usize,
        remote_dev: usize,
        qp: Arc<dyn QueuePair>,
        cq: Arc<dyn CompletionQueue>,
        max_outstanding: u32,
    ) -> Self {
        Self {
            slot,
            local_dev,
            remote_dev,
            qp,
            cq,
            max_outstanding,
            outstanding: AtomicU32::new(0),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slices posted and not yet completed.
    pub(crate) fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Acquire)
    }

    /// Whether the endpoint was reset.
    pub(crate) fn is_broken(&self) -> bool {
        self.lock().broken.is_some()
    }

    /// Posts `works` (or queues them behind the outstanding limit). On error nothing of
    /// `works` is left in the endpoint, and the endpoint must be reset if it says so.
    pub(crate) fn push(&self, works: Vec<Work>) -> Result<(), PushError> {
        let mut st = self.lock();
        if let Some(why) = &st.broken {
            return Err(PushError::Broken(why.clone()));
        }
        let mut posted_any = false;
        for w in works {
            if st.backlog.is_empty() && self.outstanding() < self.max_outstanding {
                if let Err(e) = self.post(&mut st, w) {
                    return Err(PushError::Post {
                        error: e,
                        posted_any,
                    });
                }
                posted_any = true;
            } else {
                st.backlog.push_back(w);
            }
        }
        Ok(())
    }

    /// Posts from the backlog while there is room.
    pub(crate) fn pump(&self) -> Result<(), VerbsError> {
        let mut st = self.lock();
        while st.broken.is_none() && self.outstanding() < self.max_outstanding {
            let Some(w) = st.backlog.pop_front() else {
                break;
            };
            self.post(&mut st, w)?;
        }
        Ok(())
    }

    fn post(&self, st: &mut State, w: Work) -> Result<(), VerbsError> {
        // Held before the status is read, so that a cancel either sees it or is seen here.
        let landing = Landing::new(&w.task);
        if w.task.status().is_terminal() || w.task.attempt() != w.attempt {
            return Ok(()); // canceled, failed or failed over: never posted
        }
        let index = match st.free.pop() {
            Some(i) => i,
            None => {
                st.slots.push(None);
                (st.slots.len() - 1) as u32
            }
        };
        let sge = [Sge {
            addr: w.local_addr,
            length: w.len,
            lkey: w.lkey,
        }];
        let wr = SendWr {
            wr_id: u64::from(index),
            opcode: w.opcode,
            sg_list: &sge,
            signaled: true,
            remote_addr: w.remote_addr,
            rkey: w.rkey,
        };
        // SAFETY: the slice lies inside `w.local`'s region (the engine checked the request's
        // range against it, and the lkey is that region's MR on this device). `w.local`
        // keeps the region mapped and registered: it moves into the slot below and stays
        // there until the completion is taken (`complete`) or the QP has been moved to ERR
        // (`break_all` after `handshake::to_error`), and the MR deregisters, fencing the
        // device off the memory, only when its last holder drops. Aliasing: nothing in this
        // crate touches the slice's bytes while it is posted, and no Rust reference to region
        // memory outlives a copy; other accesses to the same bytes (an overlapping transfer,
        // a user's write to `region.buffer`, a later attempt of the task elsewhere after an
        // attempt deadline) are the engine's usage rule, one transfer per range at a time,
        // as between any two transports. The rkey is the one the peer published for this
        // buffer, and the peer's device checks the remote range against it.
        if let Err(e) = unsafe { self.qp.post_send(std::slice::from_ref(&wr)) } {
            st.free.push(index);
            return Err(e.error);
        }
        let posted = Instant::now();
        if w.starts_share {
            // Nothing of this endpoint's queue is ahead of its share any more.
            w.task.started(w.attempt, posted);
        }
        st.slots[index as usize] = Some(Slot {
            task: w.task,
            attempt: w.attempt,
            bytes: w.len,
            posted,
            check: w.check,
            _local: w.local,
            _landing: landing,
        });
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Takes the slot a completion names (`None` for stale or unknown ids).
    pub(crate) fn complete(&self, wr_id: u64) -> Option<Slot> {
        let mut st = self.lock();
        let index = usize::try_from(wr_id).ok()?;
        let slot = st.slots.get_mut(index)?.take()?;
        st.free.push(index as u32);
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        Some(slot)
    }

    /// When the oldest posted slice was posted.
    pub(crate) fn oldest(&self) -> Option<Instant> {
        if self.outstanding() == 0 {
            return None;
        }
        self.lock().slots.iter().flatten().map(|s| s.posted).min()
    }

    /// Marks the endpoint broken and takes every posted and queued slice (to be failed by
    /// the caller, outside the lock). Idempotent: a second call returns nothing.
    pub(crate) fn break_all(&self, why: &str) -> Vec<(Arc<Task>, u32)> {
        let mut st = self.lock();
        if st.broken.is_none() {
            st.broken = Some(why.to_string());
        }
        let mut out: Vec<(Arc<Task>, u32)> = st
            .slots
            .iter_mut()
            .filter_map(Option::take)
            .map(|s| (s.task, s.attempt))
            .collect();
        out.extend(st.backlog.drain(..).map(|w| (w.task, w.attempt)));
        st.free.clear();
        st.slots.clear();
        self.outstanding.store(0, Ordering::Release);
        out
    }
}

/// Why `push` refused work.
pub(crate) enum PushError {
    /// The endpoint was reset.
    Broken(String),
    /// `post_send` failed; the endpoint must be reset.
    Post {
        error: VerbsError,
        /// Whether earlier slices of the same push were posted.
        posted_any: bool,
    },
}
