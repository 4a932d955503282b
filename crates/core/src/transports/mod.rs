//! Transport implementations.

pub mod tcp;
