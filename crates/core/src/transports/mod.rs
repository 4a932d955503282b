//! Transport implementations.

pub mod fault;
#[cfg(target_os = "linux")]
pub mod shm;
pub mod tcp;
