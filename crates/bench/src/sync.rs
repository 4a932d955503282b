//! The synchronization types and threads of the task gate, the crate's model-checked
//! module: std's, or loom's when the crate's tests are built with `--cfg ferry_loom`
//! (`npm run test:model`), so that loom explores every interleaving of the gate the product
//! runs. Only `gate` uses this.

#[cfg(not(all(test, ferry_loom)))]
pub(crate) use std::{
    sync::{atomic::AtomicBool, Arc, Condvar, Mutex, MutexGuard},
    thread,
};

#[cfg(all(test, ferry_loom))]
pub(crate) use loom::{
    sync::{atomic::AtomicBool, Arc, Condvar, Mutex, MutexGuard},
    thread,
};
