//! Thin safe wrappers over the few syscalls nix does not cover. The unsafe code of the crate
//! lives here and in `holder::child`.

pub mod dbus;
pub mod lock;
pub mod mount;
pub mod mount_api;
pub mod ns;
pub mod pidfd;
pub mod process;
pub mod reaper;
