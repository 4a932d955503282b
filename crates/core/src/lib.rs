//! # ferry-core
//!
//! Ferry's transport-agnostic runtime: a process registers memory; another reads or writes
//! it by segment name and offset. This crate holds the status model, request validation,
//! the batch table, local memory, the control plane and the transports.
//!
//! ```no_run
//! use ferry_core::{Engine, EngineConfig, Opcode, Request};
//! let target = Engine::new(EngineConfig::default())?;
//! let buf = target.allocate(1 << 20)?;
//! let initiator = Engine::new(EngineConfig::default())?;
//! let local = initiator.allocate(1 << 20)?;
//! let seg = initiator.open_segment_blocking(target.segment_name())?;
//! let req = Request { opcode: Opcode::Write, local: local.id(), local_offset: 0,
//!     segment: seg.handle, remote_buffer: buf.id(), remote_offset: 0, length: 1 << 20,
//!     hint: ferry_core::TransportHint::Auto, verify: false };
//! let done = initiator.transfer_blocking(&[req])?;
//! assert_eq!(done[0].status, ferry_core::TransferStatus::Completed);
//! initiator.close();
//! target.close();
//! # Ok::<(), ferry_core::Error>(())
//! ```
//!
//! Thread safety: `Engine` is `Send + Sync` and cheap to clone; every method may be called
//! from any thread. Resources: regions are freed when released and no longer used by an
//! in-flight transfer; `close` releases everything and is idempotent.

#![warn(missing_docs, unreachable_pub)]

mod admission;
mod assembly;
mod at_once;
mod attempt;
pub mod auth;
pub mod batch;
mod block_submit;
pub mod blocks;
mod checksummed_read;
mod config;
pub mod control;
mod deadlines;
mod dispatch;
mod engine;
mod error;
mod etcd_access;
pub mod event_loop;
mod events;
pub mod failover;
mod farewell;
pub mod fence;
pub mod handle;
mod handshakes;
pub mod health;
mod incarnations;
mod inner;
pub mod integrity;
mod kind;
mod lanes;
pub mod latency;
mod lazy_now;
mod life_word;
mod link_port;
pub mod linux;
mod liveness;
pub mod memory;
pub mod metadata;
pub mod metric_families;
pub mod metrics;
mod net;
pub mod notify;
mod numbered;
pub mod peer_series;
mod peers;
mod pending;
mod plan;
mod request;
mod resource;
mod seal;
mod sealed_stream;
pub mod sealing;
pub mod segment;
mod server;
pub mod status;
mod submit;
mod sync;
mod tally;
pub mod task;
mod task_slots;
pub mod ticks;
pub mod transport;
pub mod transports;
pub mod user_secret;
pub mod wake;
pub mod wire;

pub use admission::ConnLimits;
pub use block_submit::BlockSubmission;
pub use config::spread::{auto_io_threads, auto_lanes, machine_cores, EngineSpread};
pub use config::EngineConfig;
pub use engine::{BatchSnapshot, Engine, SegmentInfo, WeakEngine};
pub use error::{Error, ErrorCode, Result};
pub use events::{EngineEvent, EventSink};
pub use kind::{Kinds, Opcode, TransportHint, TransportKind, DEFAULT_ORDER};
pub use lanes::Lent;
pub use liveness::{LossKind, LossReason};
pub use memory::{Access, Region, RegionId};
pub use metadata::{EtcdAuth, EtcdConfig, EtcdIdentity, EtcdTls};
pub use metrics::Metrics;
pub use notify::{Notification, NotifyConfig, NotifyOutcome};
pub use numbered::{Numbered, UnknownNumber};
pub use request::Request;
pub use sealing::Encrypt;
pub use status::TransferStatus;
pub use task::TaskSnapshot;
