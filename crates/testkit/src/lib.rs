//! Support for Ferry's integration tests (a dev-dependency of the crates that have them).
//!
//! Only ferry-core's public API is used, so the tests built on it check what users see.
//!
//! - [`within`]: runs a test body under a watchdog;
//! - [`Pair`]: a target and an initiator engine, a region on each, the target's segment
//!   opened from the initiator, the initiator's events recorded; both engines close on drop;
//! - [`fill`], [`bytes_of`], [`bytes_at`]: write a pattern into a region, copy bytes out;
//! - [`user_region`]: registered (leaked) user memory with a chosen access;
//! - [`request`], [`wait_batch`], [`one`]: requests and bounded waits on their outcome;
//! - [`lists`]: scattered block lists run to their end, counted by status and checked
//!   byte for byte (the attempt-deadline tests of each transport);
//! - [`notes`]: a target-side notification handler that checks the data is in place;
//! - [`Proxy`]: a TCP forwarder whose connections a test freezes, cuts, pauses or corrupts
//!   (a byte flipped at a stream position, [`Flip`]);
//! - [`raw`]: raw wire clients' pieces ([`raw::hello`], [`raw::read_to_close`],
//!   [`raw::ops_in`]), this process's shm sockets ([`raw::shm_sockets`]) and its resident
//!   memory ([`raw::resident_bytes`]);
//! - [`EtcdServer`]: a throwaway etcd, ready, killed on drop; [`spawn_etcd`],
//!   [`etcd_healthy`]: the pieces, for tests that stop, pause or restart it;
//!   [`skip_without_etcd!`], [`etcd_missing`]: skip a test where etcd is not installed
//!   (outside CI; under CI that fails it);
//! - [`unused_port`]: a port for a server started later, outside the kernel's ephemeral range.

mod etcd;
pub mod lists;
pub mod notes;
mod pair;
mod ports;
mod proxy;
pub mod raw;
mod region;
mod still;
mod wait;

pub use etcd::{etcd_healthy, etcd_missing, spawn_etcd, EtcdServer};
pub use pair::{request, Pair};
pub use ports::unused_port;
pub use proxy::{Flip, Proxy};
pub use region::{bytes_at, bytes_of, fill, user_region};
pub use still::{assert_still, hash_region, wait_first_bytes};
pub use wait::{one, wait_batch, within};
