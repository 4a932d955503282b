//! The locks and the lanes' own `Arc` of `lanes`, whose concurrency is model-checked: std's,
//! or loom's when the crate's tests are built with `--cfg ferry_loom` (`npm run test:model`),
//! so that loom explores every interleaving of the code the product runs. Only `lanes` and
//! `tally` use this; `task_slots`' reuse is generic over its pointer instead (a task's `Arc` is std's
//! throughout the crate), and everything else takes std's directly.

#[cfg(not(all(test, ferry_loom)))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicU64},
    Arc, RwLock, RwLockReadGuard,
};

#[cfg(all(test, ferry_loom))]
pub(crate) use loom::sync::{
    atomic::{AtomicBool, AtomicU64},
    Arc, RwLock, RwLockReadGuard,
};
