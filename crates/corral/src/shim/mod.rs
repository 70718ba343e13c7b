//! containerd's binary protocol for shims: flags, `start`, `delete`, the server loop and logging.
//! Knows nothing about pods beyond handing requests to [`crate::service`].

pub mod args;
pub mod bootstrap;
pub mod delete;
pub mod logging;
pub mod server;
pub mod start;
