//! RDMA verbs for Ferry.
//!
//! `provider` is the verbs interface the transport is written against; `ibverbs` implements
//! it over the system's libibverbs (loaded with dlopen at run time, so the addon loads
//! where no RDMA stack is installed) and `emulated` implements it in software, so the
//! transport runs unchanged where no NIC exists.

#![warn(missing_docs, unreachable_pub)]

#[cfg(target_os = "linux")]
pub mod emulated;
#[cfg(target_os = "linux")]
pub mod ibverbs;
pub mod provider;
