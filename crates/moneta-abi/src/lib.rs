//! The interface between Moneta's trusted device and its untrusted clients.
//!
//! Everything both sides agree on lives here and nothing else: the channel's shared-memory
//! layout ([`channel`]), the command and status encoding ([`command`], [`status`]), error-queue
//! entries, and the control protocol spoken over the daemon's Unix socket ([`control`]).
//! `docs/abi.md` describes the same bytes for a reader writing a client in another language.
//!
//! Shared structures are `#[repr(C)]` and made only of atomics, so a reference to one never
//! claims that memory another process can write is immutable.

#![forbid(unsafe_code)]

pub mod channel;
pub mod command;
pub mod control;
pub mod durable;
pub mod fsproto;
pub mod kfsproto;
pub mod lease;
pub mod sizelease;
pub mod solelease;
pub mod status;

pub use channel::*;
pub use command::*;
pub use durable::*;
pub use lease::*;
pub use sizelease::*;
pub use solelease::*;
pub use status::*;

/// Version of the channel layout and command encoding. A client must see this value in the
/// channel header before using the channel.
pub const ABI_VERSION: u32 = 2;

/// Version of the control protocol carried in every control message header.
pub const CONTROL_VERSION: u16 = 3;
