//! The pod's containers, run through the OCI runtime.

pub mod container;
pub mod oci;
pub mod process;
pub mod rootfs;
pub mod runc;
pub mod stdio;

pub use container::Container;
pub use process::{ExitInfo, Process, Status};
