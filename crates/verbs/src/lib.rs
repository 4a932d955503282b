//! RDMA verbs for Ferry.
//!
//! `provider` is the verbs interface the transport is written against; `ibverbs` implements
//! it over the system's libibverbs (loaded with dlopen at run time, so the addon loads
//! where no RDMA stack is installed) and `emulated` implements it in software, so the
//! transport runs unchanged where no NIC exists.
//!
//! # Quick start
//!
//! ```no_run
//! # #[cfg(target_os = "linux")]
//! # fn main() -> ferry_verbs::provider::VerbsResult<()> {
//! use ferry_verbs::emulated::{EmulatedFaults, EmulatedProvider};
//! use ferry_verbs::provider::{Provider, QpCaps};
//!
//! // Chosen explicitly; never silently in place of a real NIC.
//! let provider = EmulatedProvider::new(EmulatedFaults::default());
//! // or: let provider = ferry_verbs::ibverbs::IbverbsProvider::load()?;
//! let name = provider.devices()?[0].name.clone();
//! let ctx = provider.open(&name)?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(256)?;
//! let caps = QpCaps { max_send_wr: 64, max_recv_wr: 1, max_send_sge: 4, max_recv_sge: 1 };
//! let qp = pd.create_qp(&cq, &cq, caps)?;
//! // modify RESET → INIT → RTR → RTS with the peer's qpn and gid, then post_send / poll.
//! # drop(qp);
//! # Ok(())
//! # }
//! # #[cfg(not(target_os = "linux"))]
//! # fn main() {}
//! ```
//!
//! # Threads and release
//!
//! Every handle is `Send + Sync` and may be used from any thread. Handles are `Arc`s that
//! hold their parents, so resources are released in verbs order whatever order the user
//! drops them in: a QP before its CQs and PD, an MR before its PD, everything before the
//! device is closed. The emulated device's threads stop when the handles that own them drop
//! (a QP's when the QP drops, the responder's when the process's last context drops).

#![warn(missing_docs, unreachable_pub)]

#[cfg(target_os = "linux")]
pub mod emulated;
#[cfg(target_os = "linux")]
pub mod ibverbs;
pub mod provider;
pub mod transport;

pub use transport::{ProviderChoice, RdmaConfig, RdmaFactory, RdmaTransport};
