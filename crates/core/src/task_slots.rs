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
    match spare {
        // `Err` never happens: a spare is held by this thread's list alone.
        Some(slot) => fill::<StdArc, _>(slot, value).unwrap_or_else(Arc::new),
        None => Arc::new(value),
    }
}

/// Lets `value` go: its slot is emptied and kept for this thread's next value when nobody
/// else holds it and this thread has room; otherwise it is dropped as usual.
pub(crate) fn recycle<T>(spares: &'static LocalKey<Spares<T>>, value: Arc<T>) {
    let Some(slot) = vacate::<StdArc, _>(value) else {
        return;
    };
    let _ = spares.try_with(|s| {
        if let Ok(mut spares) = s.0.try_borrow_mut() {
            if spares.len() < SPARES_PER_THREAD {
                spares.push(slot);
            }
        }
    });
}

/// What reusing an allocation needs of a shared pointer: std's `Arc` for tasks; loom's in
/// the model (`mod model`), which runs [`vacate`] and [`fill`] themselves.
trait SharedPtr {
    /// The shared pointer to a `T`.
    type To<T>;

    /// `Arc::get_mut`: the value, if this is its only reference (no other strong or weak
    /// one).
    fn get_mut<T>(this: &mut Self::To<T>) -> Option<&mut T>;

    /// `Arc::into_raw`.
    fn into_raw<T>(this: Self::To<T>) -> *const T;

    /// `Arc::from_raw`.
    ///
    /// # Safety
    /// As `Arc::from_raw`'s: `ptr` comes from [`SharedPtr::into_raw`] of a `To<U>` whose
    /// `U` has the size and alignment of `T`, and is turned back into a pointer once.
    unsafe fn from_raw<T>(ptr: *const T) -> Self::To<T>;
}

/// std's `Arc`.
enum StdArc {}

impl SharedPtr for StdArc {
    type To<T> = Arc<T>;

    fn get_mut<T>(this: &mut Arc<T>) -> Option<&mut T> {
        Arc::get_mut(this)
    }

    fn into_raw<T>(this: Arc<T>) -> *const T {
        Arc::into_raw(this)
    }

    unsafe fn from_raw<T>(ptr: *const T) -> Arc<T> {
        // SAFETY: the caller keeps `from_raw`'s contract, which is `Arc::from_raw`'s.
        unsafe { Arc::from_raw(ptr) }
    }
}

/// Drops the value and hands back its empty allocation, if `value` is its only reference;
/// `None` (and the reference dropped) otherwise.
fn vacate<P: SharedPtr, T>(mut value: P::To<T>) -> Option<P::To<MaybeUninit<T>>> {
    // Checked before the conversion: when another holder remains, `value` is dropped as a
    // `T`, so whichever reference goes last drops the value. (`--cfg ferry_seed="slots"`
    // leaves it out, which the model must catch.)
    #[cfg(not(ferry_seed = "slots"))]
    P::get_mut(&mut value)?;
    // SAFETY: the pointer comes from `into_raw` of a `To<T>`, and `MaybeUninit<T>` has the
    // size and alignment of `T` (it is `repr(transparent)`), which is what `from_raw` asks
    // of a pointer made by a pointer to another type. Nothing is dropped by the conversion:
    // the value is dropped explicitly below.
    let mut slot = unsafe { P::from_raw(P::into_raw(value).cast::<MaybeUninit<T>>()) };
    // Still the only reference: nothing could copy it since `get_mut` above said so. If it
    // were not, the value would be leaked (not dropped twice) with this reference.
    let memory = P::get_mut(&mut slot)?;
    // SAFETY: the value is initialized (it was a live `T`), this is the only reference to
    // it, and from here on the slot's type never drops it again; `fill` initializes it
    // before it is read as a `T`.
    unsafe { memory.assume_init_drop() };
    Some(slot)
}

/// `value` in the empty allocation `slot`, if `slot` is its only reference; `value` back
/// otherwise.
fn fill<P: SharedPtr, T>(mut slot: P::To<MaybeUninit<T>>, value: T) -> Result<P::To<T>, T> {
    let Some(memory) = P::get_mut(&mut slot) else {
        return Err(value);
    };
    memory.write(value);
    // SAFETY: the value was initialized by the `write` just above; the pointer comes from
    // `into_raw` of a `To<MaybeUninit<T>>`, which has the size and alignment of `T`.
    Ok(unsafe { P::from_raw(P::into_raw(slot).cast::<T>()) })
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

#[cfg(all(test, ferry_loom))]
mod model {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    use super::{fill, vacate, SharedPtr};

    /// loom's `Arc`.
    enum LoomArc {}

    impl SharedPtr for LoomArc {
        type To<T> = Arc<T>;

        fn get_mut<T>(this: &mut Arc<T>) -> Option<&mut T> {
            Arc::get_mut(this)
        }

        fn into_raw<T>(this: Arc<T>) -> *const T {
            Arc::into_raw(this)
        }

        unsafe fn from_raw<T>(ptr: *const T) -> Arc<T> {
            // SAFETY: the caller keeps `from_raw`'s contract, which is `Arc::from_raw`'s.
            unsafe { Arc::from_raw(ptr) }
        }
    }

    /// A task's stand-in: its number, a reference it holds, and a field its holders read
    /// and its drop writes (loom reports the two unordered).
    struct Probe {
        number: u32,
        _held: Arc<()>,
        field: UnsafeCell<u32>,
    }

    // SAFETY: `field` is read through `&Probe` by holders and written only by `drop`, after
    // every holder let go; loom checks that order in every interleaving.
    unsafe impl Sync for Probe {}

    impl Probe {
        fn new(number: u32, held: &Arc<()>) -> Self {
            Self {
                number,
                _held: held.clone(),
                field: UnsafeCell::new(number),
            }
        }

        /// What a holder sees: the number and the field, which must agree.
        fn read(&self) -> u32 {
            // SAFETY: a shared read; writes happen only in `drop` (see `Sync`).
            let field = self.field.with(|f| unsafe { *f });
            assert_eq!(field, self.number, "a holder saw its task half refilled");
            self.number
        }
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            // SAFETY: `&mut self`: no holder is left.
            self.field.with_mut(|f| unsafe { *f = 0 });
        }
    }

    fn vacate_probe(task: Arc<Probe>) -> Option<Arc<std::mem::MaybeUninit<Probe>>> {
        vacate::<LoomArc, _>(task)
    }

    #[test]
    fn a_slot_is_refilled_only_once_its_last_holder_let_go() {
        loom::model(|| {
            let held = Arc::new(());
            let task = Arc::new(Probe::new(1, &held));
            let holder = {
                let task = task.clone();
                thread::spawn(move || task.read())
            };
            if let Some(slot) = vacate_probe(task) {
                assert_eq!(
                    Arc::strong_count(&held),
                    1,
                    "vacated: its references dropped"
                );
                let next = fill::<LoomArc, _>(slot, Probe::new(2, &held));
                let next = next.ok().expect("a vacated slot is its taker's alone");
                assert_eq!(next.read(), 2);
            }
            assert_eq!(
                holder.join().expect("holder"),
                1,
                "the holder's task refilled"
            );
            assert_eq!(Arc::strong_count(&held), 1, "each task dropped once");
        });
    }

    #[test]
    fn two_holders_letting_go_at_once_drop_the_task_once() {
        loom::model(|| {
            let held = Arc::new(());
            let task = Arc::new(Probe::new(1, &held));
            let other = {
                let task = task.clone();
                thread::spawn(move || {
                    assert_eq!(task.read(), 1);
                    vacate_probe(task)
                })
            };
            let mine = vacate_probe(task);
            let theirs = other.join().expect("other holder");
            assert!(
                mine.is_none() || theirs.is_none(),
                "one allocation kept by both"
            );
            assert_eq!(Arc::strong_count(&held), 1, "the task dropped once");
        });
    }
}
