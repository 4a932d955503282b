//! rdma-sys 0.3.0 with its bindgen output committed (see Cargo.toml). The bindings depend
//! on the target's C ABI (`pthread_mutex_t` inside `ibv_context` differs in size between
//! x86_64 and aarch64), so there is one file per architecture that Ferry builds for.
#![allow(warnings)]
#![allow(non_snake_case, non_camel_case_types, non_upper_case_globals)]
#![allow(deref_nullptr)]
#![allow(clippy::all)]

use libc::*;

#[cfg(target_arch = "x86_64")]
include!("bindings/x86_64.rs");
#[cfg(target_arch = "aarch64")]
include!("bindings/aarch64.rs");
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!(
    "rdma-sys: no committed bindings for this architecture; add it to scripts/rdma-bindings and run it"
);

mod opcode;
mod types;
mod verbs;

pub use self::opcode::*;
pub use self::types::*;
pub use self::verbs::*;
