//! Task slots reused: the memory of a task nobody holds any more is kept by the thread
//! that let it go and filled with that thread's next task, so a poller that submits, polls
//! and frees (tebench's loop, a scheduler's batches) allocates nothing for its tasks once
//! warm.
//!
//! A slot is emptied as it is kept: the task's value is dropped then, with every reference
//! it held (its region, its peer, its group), so a spare slot pins no registered memory and
//! keeps no segment open. What stays is the bare allocation (`Arc<MaybeUninit<T>>`).
//! A task someone else still holds (a transport finishing with it, a waiter) is not kept;
//! it is dropped with its last holder, as any `Arc`.
//!
//! Generic over the value: `task` declares the thread-local list of its `Task`s
//! (`Spares<Task>`) and passes it in.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::thread::LocalKey;

/// Spare slots one thread keeps at most. A poller's batches rarely hold more tasks at once;
/// more than that are dropped as before.
const SPARES_PER_THREAD: usize = 256;

/// An empty slot: an `Arc`'s allocation, its value not initialized.
type Slot<T> = Arc<MaybeUninit<T>>;

/// One thread's spare slots for values of type `T`: the value of a `thread_local!`.
pub(crate) struct Spares<T>(RefCell<Vec<Slot<T>>>);

impl<T> Spares<T> {
    /// No spares yet.
    pub(crate) const fn new() -> Self {
        Self(RefCell::new(Vec::new()))
    }
}

/// `value` in a shared slot: a spare of this thread's, or a new one.
pub(crate) fn place<T>(spares: &'static LocalKey<Spares<T>>, value: T) -> Arc<T> {
    // `try_with`: while the thread is being torn down its spares are gone.
    let spare = spares
        .try_with(|s| s.0.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten();
    let Some(mut slot) = spare else {
        return Arc::new(value);
    };
    let Some(memory) = Arc::get_mut(&mut slot) else {
        // Never: a spare is held by this thread's list alone.
        return Arc::new(value);
    };
    memory.write(value);
    // SAFETY: the slot's value was initialized by the `write` just above.
    unsafe { slot.assume_init() }
}

/// Lets `value` go: its slot is emptied and kept for this thread's next value when nobody
/// else holds it and this thread has room; otherwise it is dropped as usual.
pub(crate) fn recycle<T>(spares: &'static LocalKey<Spares<T>>, value: Arc<T>) {
    let Some(slot) = vacate(value) else { return };
    let _ = spares.try_with(|s| {
        if let Ok(mut spares) = s.0.try_borrow_mut() {
            if spares.len() < SPARES_PER_THREAD {
                spares.push(slot);
            }
        }
    });
}

/// Drops the value and hands back its empty slot, if `value` is its only reference (no
/// other `Arc`, no `Weak`); `None` (and the reference dropped) otherwise.
fn vacate<T>(mut value: Arc<T>) -> Option<Slot<T>> {
    Arc::get_mut(&mut value)?;
    // SAFETY: the pointer comes from `Arc<T>::into_raw`, and `MaybeUninit<T>` has the size
    // and alignment of `T` (it is `repr(transparent)`), which is what `Arc::from_raw` asks
    // of a pointer made by an `Arc` of another type. Nothing is dropped by the conversion:
    // the value is dropped explicitly below.
    let mut slot: Slot<T> = unsafe { Arc::from_raw(Arc::into_raw(value).cast::<MaybeUninit<T>>()) };
    // Still the only reference: nothing could copy it since `get_mut` above said so. If it
    // were not, the value would be leaked (not dropped twice) with this reference.
    let memory = Arc::get_mut(&mut slot)?;
    // SAFETY: the value is initialized (it was a live `T`), this is the only reference to
    // it, and from here on the slot's type never drops it again; `place` initializes it
    // before it is read as a `T`.
    unsafe { memory.assume_init_drop() };
    Some(slot)
}

/// Spare slots the calling thread holds in `spares` (tests).
#[cfg(test)]
pub(crate) fn count<T>(spares: &'static LocalKey<Spares<T>>) -> usize {
    spares.with(|s| s.0.borrow().len())
}

#[cfg(test)]
mod tests {
    use std::sync::Weak;

    use super::*;
    use crate::task::tests::{spares, waiting_task};
    use crate::task::Task;

    #[test]
    fn a_task_let_go_alone_gives_its_memory_to_the_next_one_and_drops_what_it_held() {
        // A fresh thread: its list starts empty whatever other tests did.
        std::thread::spawn(|| {
            let (task, held) = waiting_task();
            let first = Arc::as_ptr(&task) as usize;
            assert_eq!(Arc::strong_count(&held), 2, "the task holds its group");
            Task::recycle(task);
            assert_eq!(spares(), 1);
            assert_eq!(
                Arc::strong_count(&held),
                1,
                "a kept slot holds none of the task's references"
            );
            let (next, _) = waiting_task();
            assert_eq!(Arc::as_ptr(&next) as usize, first, "the same memory again");
            assert_eq!(spares(), 0);
            assert_eq!(next.status(), crate::status::TransferStatus::Waiting);
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn a_task_held_elsewhere_is_not_kept() {
        std::thread::spawn(|| {
            let (task, held) = waiting_task();
            let other = task.clone();
            Task::recycle(task);
            assert_eq!(spares(), 0);
            assert_eq!(other.status(), crate::status::TransferStatus::Waiting);
            drop(other);
            assert_eq!(Arc::strong_count(&held), 1, "dropped with its last holder");

            let (task, _) = waiting_task();
            let weak: Weak<Task> = Arc::downgrade(&task);
            Task::recycle(task);
            assert_eq!(spares(), 0, "a weak reference keeps it from being reused");
            assert!(weak.upgrade().is_none());
        })
        .join()
        .expect("test thread");
    }

    #[test]
    fn a_thread_keeps_a_bounded_number_of_spares() {
        std::thread::spawn(|| {
            let tasks: Vec<_> = (0..SPARES_PER_THREAD + 10)
                .map(|_| waiting_task().0)
                .collect();
            for t in tasks {
                Task::recycle(t);
            }
            assert_eq!(spares(), SPARES_PER_THREAD);
        })
        .join()
        .expect("test thread");
    }
}
