//! containerd's binary protocol for shims: flags, `start`, `delete`, the server loop and logging.
//! Knows nothing about pods beyond handing requests to [`crate::service`].

pub mod args;
pub mod bootstrap;
pub mod delete;
pub mod info;
pub mod logging;
pub mod server;
pub mod start;

/// argv[0] of the processes corral spawns from its own executable (server, holder), so `ps`
/// shows what they are.
pub const BINARY_NAME: &str = "containerd-shim-corral-v2";

/// The name (a link to the same binary) under which `start` puts every pod in node mode; the
/// runtime_type `io.containerd.corral-node.v2` makes containerd run it.
pub const NODE_BINARY_NAME: &str = "containerd-shim-corral-node-v2";
