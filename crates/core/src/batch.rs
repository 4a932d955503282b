//! The batch table. Ids given out are checked at every use: each id is an engine handle
//! (`handle.rs`: engine tag and kind) whose payload packs a generation and a slot, so a
//! freed, stale or foreign id is refused, never dereferenced.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::handle::{HandleKind, Handles, PAYLOAD_BITS};
use crate::kind::TransportKind;
use crate::lanes::Striped;
use crate::status::{aggregate, TransferStatus};
use crate::task::{Task, TaskSnapshot};
use crate::wake::Wake;

/// One request of a batch: a task, or a request its transport completed while it was
/// submitted (`Transport::complete_now`), which needs no task: nothing of it can change.
pub enum Entry {
    /// Under way, or ended, as its task says.
    Task(Arc<Task>),
    /// Completed at submission, in one attempt.
    Done {
        /// Bytes moved: the request's length.
        length: u64,
        /// The transport that moved them.
        transport: TransportKind,
    },
}

impl Entry {
    /// Its status.
    pub fn status(&self) -> TransferStatus {
        match self {
            Self::Task(t) => t.shown_status(),
            Self::Done { .. } => TransferStatus::Completed,
        }
    }

    /// Bytes known to have moved.
    pub fn transferred(&self) -> u64 {
        match self {
            Self::Task(t) => t.transferred(),
            Self::Done { length, .. } => *length,
        }
    }

    /// A view of it, as [`Task::snapshot`].
    pub fn snapshot(&self) -> TaskSnapshot {
        match self {
            Self::Task(t) => t.snapshot(),
            &Self::Done { length, transport } => TaskSnapshot {
                status: TransferStatus::Completed,
                transferred: length,
                length,
                transport: Some(transport),
                attempts: 1,
                error: None,
            },
        }
    }

    /// Its task, if it has one.
    pub fn task(&self) -> Option<&Arc<Task>> {
        match self {
            Self::Task(t) => Some(t),
            Self::Done { .. } => None,
        }
    }
}

const SLOT_BITS: u32 = 20;
const GEN_BITS: u32 = PAYLOAD_BITS - SLOT_BITS;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
/// Most batches alive at once in one engine.
pub const MAX_BATCHES: usize = 1 << SLOT_BITS;
/// Most tasks one batch may hold.
pub const MAX_BATCH_CAPACITY: usize = 1 << 20;

/// A group of tasks submitted and polled together.
///
/// A freed batch that nobody else holds is kept as a spare of its shard, its task list's
/// buffer with it, and handed out again by the next allocation there: a poller that
/// allocates, submits, polls and frees a batch per operation allocates no memory for it.
pub struct Batch {
    capacity: usize,
    entries: Mutex<Vec<Entry>>,
    /// How many entries there are, stored under the lock as they change: read without it
    /// by the early room check, which `fill` repeats under the lock.
    len: AtomicUsize,
    /// While every entry was done at submission: how many and their bytes ([`AllDone`]),
    /// stored under the lock as entries are added, so that a status read of such a batch
    /// (a poller's, in a loop) takes no lock.
    all_done: AtomicU64,
    /// Rung by each of its tasks as it ends, and when the batch is freed.
    wake: Arc<Wake>,
    /// Set once its tasks were taken out (freed, or the engine closed).
    freed: AtomicBool,
}

impl Batch {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            entries: Mutex::new(Vec::with_capacity(capacity.min(TASKS_RESERVED))),
            len: AtomicUsize::new(0),
            all_done: AtomicU64::new(AllDone::NO),
            wake: Arc::default(),
            freed: AtomicBool::new(false),
        })
    }

    /// A spare made live again for `capacity` tasks: the same memory when nobody else
    /// holds it (spares are held by their shard alone), a new batch otherwise.
    fn renew(mut spare: Arc<Self>, capacity: usize) -> Arc<Self> {
        let Some(b) = Arc::get_mut(&mut spare) else {
            return Self::new(capacity);
        };
        b.capacity = capacity;
        *b.freed.get_mut() = false;
        *b.len.get_mut() = 0;
        *b.all_done.get_mut() = AllDone::NO;
        let tasks = b.entries.get_mut().unwrap_or_else(|p| p.into_inner());
        tasks.clear();
        tasks.reserve(capacity.min(TASKS_RESERVED));
        spare
    }

    /// Capacity given at allocation.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// What its tasks ring as they end.
    pub fn wake(&self) -> &Arc<Wake> {
        &self.wake
    }

    /// Waits until every task is terminal (and at least one was submitted) or the batch
    /// is freed, or until `deadline`; returns whether one of those happened.
    pub fn wait_until(&self, deadline: Instant) -> bool {
        self.wake.wait_until(
            || {
                if self.freed.load(Ordering::Acquire) {
                    return true;
                }
                let (status, _, tasks) = self.status();
                tasks > 0 && status.is_terminal()
            },
            deadline,
        )
    }

    /// Appends tasks if they fit; returns the index of the first.
    pub(crate) fn push(&self, id: u64, tasks: &[Arc<Task>]) -> Result<usize> {
        self.fill(id, tasks.len(), |all| {
            all.extend(tasks.iter().cloned().map(Entry::Task))
        })
        .map(|(first, ())| first)
    }

    /// Has `fill` append `count` entries (or none) under the batch's lock, if they fit:
    /// what `fill` does happens only for a submission the batch takes, and no other
    /// submission comes between the check and the entries. Returns the index of the first
    /// and what `fill` returned. Status reads of a batch with a task wait meanwhile.
    pub(crate) fn fill<R>(
        &self,
        id: u64,
        count: usize,
        fill: impl FnOnce(&mut Vec<Entry>) -> R,
    ) -> Result<(usize, R)> {
        let mut all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() + count > self.capacity {
            return Err(Error::BatchFull {
                batch: id,
                capacity: self.capacity,
                requested: count,
            });
        }
        let first = all.len();
        let r = fill(&mut all);
        debug_assert!(
            all.len() == first + count || all.len() == first,
            "fill appends what it said, or nothing"
        );
        let before = match first {
            0 => AllDone::EMPTY,
            _ => self.all_done.load(Ordering::Relaxed),
        };
        self.all_done
            .store(AllDone::adding(before, &all[first..]), Ordering::Release);
        self.len.store(all.len(), Ordering::Relaxed);
        Ok((first, r))
    }

    /// Checks that `count` more tasks would fit, as of the last submission this thread can
    /// see (an early answer that takes no lock; `fill` checks again under the lock).
    pub(crate) fn check_room(&self, id: u64, count: usize) -> Result<()> {
        if self.len.load(Ordering::Relaxed).saturating_add(count) > self.capacity {
            return Err(Error::BatchFull {
                batch: id,
                capacity: self.capacity,
                requested: count,
            });
        }
        Ok(())
    }

    /// A snapshot of the entry at `index`.
    pub fn snapshot(&self, index: usize) -> Option<TaskSnapshot> {
        self.with_entries(|all| all.get(index).map(Entry::snapshot))
    }

    /// Runs `f` on the entries under the batch's lock (status reads that allocate nothing).
    pub fn with_entries<R>(&self, f: impl FnOnce(&[Entry]) -> R) -> R {
        f(&self.entries.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Its tasks (entries completed at submission have none).
    pub fn tasks(&self) -> Vec<Arc<Task>> {
        self.with_entries(|all| all.iter().filter_map(Entry::task).cloned().collect())
    }

    /// Snapshots of every entry.
    pub fn snapshots(&self) -> Vec<TaskSnapshot> {
        self.with_entries(|all| all.iter().map(Entry::snapshot).collect())
    }

    /// The aggregate status and bytes moved. Reads each task's atomics under the batch's
    /// lock: no snapshot, no copy of the task list (this is what pollers call in a loop).
    pub fn status(&self) -> (TransferStatus, u64, usize) {
        // Entries done at submission never change: their summary is the status.
        if let Some((count, bytes)) = AllDone::read(self.all_done.load(Ordering::Acquire)) {
            return (TransferStatus::Completed, bytes, count);
        }
        let all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = all.iter().map(Entry::transferred).sum();
        (aggregate(all.iter().map(Entry::status)), bytes, all.len())
    }

    /// Takes every entry out (the batch is being freed).
    pub(crate) fn take_entries(&self) -> Vec<Entry> {
        let mut all = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let tasks = std::mem::take(&mut *all);
        self.len.store(0, Ordering::Relaxed);
        self.all_done.store(AllDone::NO, Ordering::Release);
        drop(all);
        self.freed.store(true, Ordering::Release);
        self.wake.ring();
        tasks
    }
}

/// The summary of a batch whose every entry was done at submission, packed in one word so
/// that it is read whole: a flag (bit 63), the entries' count (21 bits: up to
/// [`MAX_BATCH_CAPACITY`]) and their bytes (42 bits). [`AllDone::NO`] once any entry is a
/// task, or the bytes outgrow their bits: such a batch's status is read under its lock.
struct AllDone;

impl AllDone {
    const FLAG: u64 = 1 << 63;
    const BYTES_BITS: u32 = 42;
    const BYTES_MASK: u64 = (1 << Self::BYTES_BITS) - 1;
    const COUNT_MASK: u64 = (1 << 21) - 1;
    /// Not (or no longer) a batch of entries done at submission.
    const NO: u64 = 0;
    /// No entry yet.
    const EMPTY: u64 = Self::FLAG;

    /// The summary `before` (of the entries already there) with `added` appended.
    fn adding(before: u64, added: &[Entry]) -> u64 {
        let Some((mut count, mut bytes)) = Self::unpack(before) else {
            return Self::NO;
        };
        for entry in added {
            let Entry::Done { length, .. } = entry else {
                return Self::NO;
            };
            count += 1;
            bytes = bytes.saturating_add(*length);
        }
        if count as u64 > Self::COUNT_MASK || bytes > Self::BYTES_MASK {
            return Self::NO;
        }
        Self::FLAG | ((count as u64) << Self::BYTES_BITS) | bytes
    }

    fn unpack(word: u64) -> Option<(usize, u64)> {
        (word & Self::FLAG != 0).then(|| {
            let count = (word >> Self::BYTES_BITS) & Self::COUNT_MASK;
            (count as usize, word & Self::BYTES_MASK)
        })
    }

    /// How many entries and bytes, when there is at least one entry and all were done at
    /// submission.
    fn read(word: u64) -> Option<(usize, u64)> {
        Self::unpack(word).filter(|&(count, _)| count > 0)
    }
}

/// What [`BatchTable::free`] did with a batch.
pub enum Freed {
    /// Nothing was left to do: it was kept as a spare.
    Kept,
    /// Handed back to cancel what is pending and recycle.
    Taken(Arc<Batch>),
}

struct Slot {
    generation: u64,
    batch: Option<Arc<Batch>>,
}

/// Task-list capacity reserved at allocation, at most (a larger batch grows as it fills).
const TASKS_RESERVED: usize = 1024;
/// Spare batches one shard keeps.
const SPARES_PER_SHARD: usize = 16;
/// A freed batch is kept as a spare only if its capacity (what its task list grows to, at
/// most twice over) or its task list is at most this long: a spare holds that buffer while
/// it waits.
const SPARE_TASKS_MAX: usize = 256;

/// One lane's slots, the indices of its free ones, and its spare batches.
#[derive(Default)]
struct Shard {
    slots: Vec<Slot>,
    free: Vec<usize>,
    spares: Vec<Arc<Batch>>,
}

/// A slot number is its index in its shard, then the shard's lane in the low bits.
const LANE_BITS: u32 = 4;
const LANE_MASK: u64 = (1 << LANE_BITS) - 1;
const _: () = assert!(crate::lanes::LANES == 1 << LANE_BITS);
/// Most slots one shard holds.
const SHARD_SLOTS: usize = MAX_BATCHES >> LANE_BITS;

/// Slots of live batches and their generations, in shards: a thread allocates in its lane's
/// shard (another when that one is full), so threads that each allocate, poll and free
/// their own batches take locks no other thread takes (`lanes.rs`).
pub struct BatchTable {
    handles: Handles,
    shards: Striped<Mutex<Shard>>,
}

impl Default for BatchTable {
    fn default() -> Self {
        Self::new(Handles::default())
    }
}

impl BatchTable {
    /// A table whose ids are handles of `handles`.
    pub fn new(handles: Handles) -> Self {
        Self {
            handles,
            shards: Striped::default(),
        }
    }

    /// A table whose ids carry `tag`.
    pub fn with_tag(tag: u64) -> Self {
        Self::new(Handles::with_tag(tag))
    }

    fn encode(&self, lane: usize, index: usize, generation: u64) -> u64 {
        let slot = ((index as u64) << LANE_BITS) | lane as u64;
        let payload = ((generation & GEN_MASK) << SLOT_BITS) | slot;
        self.handles.encode(HandleKind::Batch, payload)
    }

    fn shard(&self, lane: usize) -> std::sync::MutexGuard<'_, Shard> {
        self.shards
            .lane(lane)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Allocates a batch for up to `capacity` tasks.
    pub fn allocate(&self, capacity: usize) -> Result<u64> {
        if capacity == 0 || capacity > MAX_BATCH_CAPACITY {
            return Err(Error::InvalidArgument(format!(
                "batch capacity must be in 1..={MAX_BATCH_CAPACITY}, got {capacity}"
            )));
        }
        let home = crate::lanes::current();
        for lane in (0..crate::lanes::LANES).map(|i| (home + i) % crate::lanes::LANES) {
            let mut guard = self.shard(lane);
            let shard = &mut *guard;
            let index = match shard.free.pop() {
                Some(i) => i,
                None if shard.slots.len() < SHARD_SLOTS => {
                    shard.slots.push(Slot {
                        generation: 0,
                        batch: None,
                    });
                    shard.slots.len() - 1
                }
                None => continue,
            };
            let batch = match shard.spares.pop() {
                Some(spare) => Batch::renew(spare, capacity),
                None => Batch::new(capacity),
            };
            let slot = &mut shard.slots[index];
            slot.generation = (slot.generation + 1) & GEN_MASK;
            slot.batch = Some(batch);
            return Ok(self.encode(lane, index, slot.generation));
        }
        Err(Error::InvalidArgument(format!(
            "too many live batches (max {MAX_BATCHES})"
        )))
    }

    /// The lane, index and generation an id names.
    fn locate(&self, id: u64) -> Result<(usize, usize, u64)> {
        // let-else, not `ok_or`: an error made eagerly is dropped on every call, and that
        // drop is a call (3 % of a 4 KiB shm op, measured).
        let Ok(payload) = self.handles.decode(HandleKind::Batch, id) else {
            return Err(Error::InvalidBatch(id));
        };
        let slot = payload & SLOT_MASK;
        Ok((
            (slot & LANE_MASK) as usize,
            (slot >> LANE_BITS) as usize,
            (payload >> SLOT_BITS) & GEN_MASK,
        ))
    }

    /// The live batch with this id.
    pub fn get(&self, id: u64) -> Result<Arc<Batch>> {
        self.with(id, Arc::clone)
    }

    /// Runs `f` on the live batch with this id, under its shard's lock: no reference taken
    /// unless `f` takes one (a poller's status read, in a loop, takes none).
    pub fn with<R>(&self, id: u64, f: impl FnOnce(&Arc<Batch>) -> R) -> Result<R> {
        let (lane, index, generation) = self.locate(id)?;
        match self.shard(lane).slots.get(index) {
            Some(Slot {
                generation: g,
                batch: Some(b),
            }) if *g == generation => Ok(f(b)),
            _ => Err(Error::InvalidBatch(id)),
        }
    }

    /// Frees a batch. One that nobody else holds and that has no task (every request was
    /// completed at submission) is kept as a spare at once, under the one lock taken here
    /// (emptied when handed out again): nothing can wait on it or be cancelled. Otherwise it is handed back, for
    /// the caller to cancel what is still pending and then [`BatchTable::recycle`] it.
    pub fn free(&self, id: u64) -> Result<Freed> {
        let (lane, index, generation) = self.locate(id)?;
        let mut guard = self.shard(lane);
        let shard = &mut *guard;
        match shard.slots.get_mut(index) {
            Some(slot) if slot.generation == generation => {
                let Some(batch) = slot.batch.take() else {
                    return Err(Error::InvalidBatch(id));
                };
                shard.free.push(index);
                // Unique under the shard's lock, where every other reference is taken (no
                // weak one is ever made): a count of one proves it, and what the last
                // other holder did before it let go is seen after the fence. Nobody can
                // wait on it, and with no task nothing is cancelled: kept as it is, and
                // emptied when handed out again (`renew`).
                let unique = Arc::strong_count(&batch) == 1;
                fence(Ordering::Acquire);
                let no_task = batch.len.load(Ordering::Relaxed) == 0
                    || AllDone::unpack(batch.all_done.load(Ordering::Relaxed)).is_some();
                if shard.spares.len() < SPARES_PER_SHARD
                    && unique
                    && no_task
                    && batch.capacity <= SPARE_TASKS_MAX
                {
                    shard.spares.push(batch);
                    return Ok(Freed::Kept);
                }
                Ok(Freed::Taken(batch))
            }
            _ => Err(Error::InvalidBatch(id)),
        }
    }

    /// Keeps a freed batch, emptied, as a spare of the calling thread's shard, with
    /// `entries` (the list taken out of it) as its list again. Dropped instead if anyone
    /// else still holds it, its list is long, or the shard has spares enough. The tasks'
    /// own slots are kept for this thread's next tasks (`task_slots.rs`).
    pub(crate) fn recycle(&self, mut batch: Arc<Batch>, mut entries: Vec<Entry>) {
        for entry in entries.drain(..) {
            if let Entry::Task(task) = entry {
                Task::recycle(task);
            }
        }
        let Some(b) = Arc::get_mut(&mut batch) else {
            return;
        };
        if entries.capacity() > SPARE_TASKS_MAX {
            return;
        }
        *b.entries.get_mut().unwrap_or_else(|p| p.into_inner()) = entries;
        let mut shard = self.shard(crate::lanes::current());
        if shard.spares.len() < SPARES_PER_SHARD {
            shard.spares.push(batch);
        }
    }

    /// Every live batch (for close); spares are dropped.
    pub fn drain(&self) -> Vec<Arc<Batch>> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut guard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let shard = &mut *guard;
            shard.spares.clear();
            for (i, slot) in shard.slots.iter_mut().enumerate() {
                if let Some(b) = slot.batch.take() {
                    out.push(b);
                    shard.free.push(i);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry done at submission, of `length` bytes.
    fn done(length: u64) -> Entry {
        Entry::Done {
            length,
            transport: TransportKind::Shm,
        }
    }

    #[test]
    fn a_wait_on_a_batch_ends_when_it_is_freed_or_at_its_deadline() {
        let table = BatchTable::default();
        let id = table.allocate(4).expect("batch");
        let batch = table.get(id).expect("live");
        // Nothing submitted: the deadline ends the wait.
        let start = Instant::now();
        assert!(!batch.wait_until(start + std::time::Duration::from_millis(20)));
        assert!(start.elapsed() >= std::time::Duration::from_millis(20));
        // Freed while (or before) a waiter sleeps: it wakes, whichever came first.
        let waiter = {
            let b = batch.clone();
            std::thread::spawn(move || {
                b.wait_until(Instant::now() + std::time::Duration::from_secs(30))
            })
        };
        let Freed::Taken(freed) = table.free(id).expect("free") else {
            panic!("a batch a waiter holds is handed back, not kept");
        };
        assert!(freed.take_entries().is_empty());
        let started = Instant::now();
        assert!(waiter.join().expect("waiter"), "woken by the free");
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
    }

    #[test]
    fn ids_are_generation_checked() {
        let table = BatchTable::with_tag(5);
        let a = table.allocate(4).expect("a");
        assert!(table.get(a).is_ok());
        assert_eq!(table.with(a, |b| b.capacity()), Ok(4));
        table.free(a).expect("free");
        // freed
        assert_eq!(table.get(a).err(), Some(Error::InvalidBatch(a)));
        assert_eq!(table.with(a, |_| ()).err(), Some(Error::InvalidBatch(a)));
        assert_eq!(table.free(a).err(), Some(Error::InvalidBatch(a)));
        // the slot is reused with a new generation: the stale id stays invalid
        let b = table.allocate(4).expect("b");
        assert_ne!(a, b);
        assert_eq!(a & SLOT_MASK, b & SLOT_MASK);
        assert!(table.get(a).is_err());
        assert!(
            table.with(a, |_| ()).is_err(),
            "a stale id reaches no batch"
        );
        assert!(table.get(b).is_ok());
    }

    #[test]
    fn a_freed_batch_nobody_holds_is_reused_empty_and_a_held_one_never() {
        let table = BatchTable::default();
        let a = table.allocate(2).expect("a");
        let first = table.get(a).expect("live");
        assert_eq!(
            first.fill(a, 2, |all| all.extend([done(8), done(8)])),
            Ok((0, ()))
        );
        let first_ptr = Arc::as_ptr(&first);
        drop(first);
        // Nobody else holds it and it has no task: kept as a spare by `free` itself.
        assert!(matches!(table.free(a), Ok(Freed::Kept)));
        // The same memory comes back, live, empty, with the new capacity; the old id
        // stays refused.
        let b = table.allocate(3).expect("b");
        let again = table.get(b).expect("live");
        assert_eq!(Arc::as_ptr(&again), first_ptr, "the spare was reused");
        assert_eq!(again.capacity(), 3);
        let (_, bytes, tasks) = again.status();
        assert_eq!((bytes, tasks), (0, 0), "empty");
        assert!(again.check_room(b, 3).is_ok(), "its room counts from zero");
        assert!(!again.freed.load(Ordering::Acquire), "live again");
        assert!(table.get(a).is_err(), "stale id refused");
        // Held by a waiter when freed: handed back, and never handed out again while that
        // one may look.
        let held = again.clone();
        drop(again);
        let Freed::Taken(freed) = table.free(b).expect("free") else {
            panic!("a held batch is handed back");
        };
        let tasks = freed.take_entries();
        table.recycle(freed, tasks);
        assert!(held.freed.load(Ordering::Acquire));
        let c = table.allocate(1).expect("c");
        assert_ne!(
            Arc::as_ptr(&table.get(c).expect("live")),
            Arc::as_ptr(&held)
        );
        assert!(
            held.freed.load(Ordering::Acquire),
            "the held one stays freed"
        );
        // Handed back, and recycled after its reader let go: reused.
        let reader = table.get(c).expect("live");
        let Freed::Taken(freed) = table.free(c).expect("free") else {
            panic!("a batch being read is handed back");
        };
        let ptr = Arc::as_ptr(&reader);
        drop(reader);
        let tasks = freed.take_entries();
        table.recycle(freed, tasks);
        let d = table.allocate(1).expect("d");
        assert_eq!(Arc::as_ptr(&table.get(d).expect("live")), ptr);
    }

    #[test]
    fn ids_from_another_engine_are_refused() {
        let one = BatchTable::default();
        let two = BatchTable::default();
        let id = one.allocate(1).expect("alloc");
        let _ = two.allocate(1).expect("alloc");
        assert!(two.get(id).is_err(), "foreign id accepted");
        assert!(one.get(id).is_ok());
        // garbage ids
        for bad in [0, u64::MAX, 1 << 53, id + 1, id ^ (1 << SLOT_BITS)] {
            assert!(one.get(bad).is_err(), "{bad:#x}");
        }
    }

    fn lane_of(id: u64) -> usize {
        (id & LANE_MASK) as usize
    }

    #[test]
    fn a_thread_allocates_in_its_own_lane_and_any_thread_may_use_the_id() {
        let table = BatchTable::default();
        let (id, lane) = std::thread::scope(|s| {
            s.spawn(|| (table.allocate(1).expect("alloc"), crate::lanes::current()))
                .join()
                .expect("thread")
        });
        assert_eq!(lane_of(id), lane);
        // Polled and freed by another thread than the one that allocated it.
        assert!(table.get(id).is_ok());
        table.free(id).expect("free");
        assert_eq!(table.get(id).err(), Some(Error::InvalidBatch(id)));
    }

    #[test]
    fn a_full_lane_spills_into_the_next_and_close_drains_every_lane() {
        let table = BatchTable::default();
        let home = crate::lanes::current();
        let ids: Vec<u64> = (0..SHARD_SLOTS)
            .map(|_| table.allocate(1).expect("alloc"))
            .collect();
        assert!(ids.iter().all(|&id| lane_of(id) == home));
        let spilled = table.allocate(1).expect("spill");
        assert_eq!(lane_of(spilled), (home + 1) % crate::lanes::LANES);
        // A slot freed at home is taken again before any other lane's.
        table.free(ids[7]).expect("free");
        let again = table.allocate(1).expect("alloc");
        assert_eq!(lane_of(again), home);
        assert_ne!(again, ids[7], "a new generation");
        assert_eq!(table.drain().len(), SHARD_SLOTS + 1);
        assert!(table.get(spilled).is_err() && table.get(again).is_err());
    }

    #[test]
    fn ids_fit_a_js_number() {
        let table = BatchTable::with_tag(u64::MAX);
        for _ in 0..100 {
            let id = table.allocate(1).expect("alloc");
            assert!(id < (1 << 52));
        }
    }

    #[test]
    fn a_fill_that_does_not_fit_runs_nothing() {
        let table = BatchTable::default();
        let id = table.allocate(2).expect("alloc");
        let batch = table.get(id).expect("get");
        assert_eq!(batch.fill(id, 1, |all| all.push(done(1))), Ok((0, ())));
        assert_eq!(
            batch.check_room(id, 2).unwrap_err().code(),
            "ERR_FERRY_BATCH_FULL",
            "the early check counts what was filled"
        );
        let mut ran = false;
        let refused = batch.fill(id, 2, |_| ran = true);
        assert_eq!(refused.unwrap_err().code(), "ERR_FERRY_BATCH_FULL");
        assert!(!ran, "what a refused submission would do never ran");
        assert_eq!(batch.fill(id, 1, |all| all.push(done(1))), Ok((1, ())));
        assert_eq!(batch.status(), (TransferStatus::Completed, 2, 2));
    }

    #[test]
    fn a_status_read_of_a_batch_done_at_submission_takes_no_lock() {
        let table = BatchTable::default();
        let id = table.allocate(4).expect("alloc");
        let batch = table.get(id).expect("get");
        let filled = batch.fill(id, 2, |all| all.extend([done(5), done(7)]));
        assert_eq!(filled, Ok((0, ())));
        // Read from another thread while this one holds the batch's lock: answered at once.
        let answer = batch.with_entries(|_| {
            let (tx, rx) = std::sync::mpsc::channel();
            let b = batch.clone();
            let reader = std::thread::spawn(move || {
                let _ = tx.send(b.status());
            });
            let answer = rx.recv_timeout(std::time::Duration::from_secs(10));
            (answer, reader)
        });
        let (answer, reader) = answer;
        reader.join().expect("reader");
        assert_eq!(answer, Ok((TransferStatus::Completed, 12, 2)));
        // Taken out (freed): read under the lock again, as an empty batch.
        assert_eq!(batch.take_entries().len(), 2);
        assert_eq!(batch.status(), (TransferStatus::Completed, 0, 0));
    }

    #[test]
    fn the_summary_of_entries_done_at_submission_counts_them_and_their_bytes() {
        let sum = AllDone::adding(AllDone::EMPTY, &[done(5), done(7)]);
        assert_eq!(AllDone::read(sum), Some((2, 12)));
        assert_eq!(
            AllDone::read(AllDone::adding(sum, &[done(1)])),
            Some((3, 13))
        );
        // No entry yet: nothing to read without the lock.
        assert_eq!(AllDone::read(AllDone::EMPTY), None);
        assert_eq!(AllDone::read(AllDone::adding(AllDone::EMPTY, &[])), None);
        // Once given up, never taken up again by later entries.
        assert_eq!(AllDone::adding(AllDone::NO, &[done(1)]), AllDone::NO);
        // Bytes past the packing: read under the lock.
        let big = AllDone::adding(AllDone::EMPTY, &[done(1 << 41)]);
        assert_eq!(AllDone::read(big), Some((1, 1 << 41)));
        assert_eq!(AllDone::adding(big, &[done(1 << 41)]), AllDone::NO);
        assert_eq!(
            AllDone::adding(AllDone::EMPTY, &[done(u64::MAX)]),
            AllDone::NO
        );
    }

    #[test]
    fn capacity_is_enforced() {
        let table = BatchTable::default();
        assert!(table.allocate(0).is_err());
        assert!(table.allocate(MAX_BATCH_CAPACITY + 1).is_err());
        let id = table.allocate(2).expect("alloc");
        let batch = table.get(id).expect("get");
        assert!(batch.check_room(id, 2).is_ok());
        assert_eq!(
            batch.check_room(id, 3).unwrap_err().code(),
            "ERR_FERRY_BATCH_FULL"
        );
        let (status, bytes, n) = batch.status();
        assert_eq!((status, bytes, n), (TransferStatus::Completed, 0, 0));
    }
}
