#![doc = include_str!("../README.md")]
pub mod checked;
pub mod clock;
pub mod error;
#[cfg(feature = "session")]
pub mod fenced;
pub mod fleet;
pub mod hostlock;
#[cfg(feature = "node")]
pub mod http;
pub mod keys;
pub mod lease;
pub mod liveness;
pub mod memory;
pub mod name;
pub mod probe;
pub mod record;
pub mod store;
#[cfg(feature = "otlp")]
pub mod telemetry;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod wake;

pub use error::{Error, ErrorKind, Result};
pub use lease::{Acquire, AcquireOptions, Lease, LeaseClient, LeaseToken};
pub use name::Name;
