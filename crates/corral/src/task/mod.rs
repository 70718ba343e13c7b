//! The pod's containers, run through the OCI runtime.

pub mod console;
pub mod container;
pub mod copy;
pub mod idmap;
pub mod logger;
pub mod oci;
pub mod process;
pub mod rootfs;
pub mod runc;
pub mod stdio;

pub use container::Container;
pub use process::{ExitInfo, Process, Status};
pub use stdio::Request as Stdio;
