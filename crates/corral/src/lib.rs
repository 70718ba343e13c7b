//! corral: a containerd shim that *is* the Kubernetes pod sandbox.
//!
//! containerd's CRI plugin (handler with `sandboxer = "shim"`) starts one corral process per pod and
//! talks to it over ttrpc: the Sandbox API for the pod, the Task API for the pod's containers. There
//! is no pause container: a tiny *holder* process keeps the pod's namespaces alive, and the
//! containers run through an OCI runtime (runc).
//!
//! The pod's life in five steps:
//! 1. `start` ([`shim::start`]) binds the socket, spawns the server, prints the bootstrap JSON.
//! 2. `CreateSandbox` ([`service::sandbox`]) validates the PodSandboxConfig ([`pod::spec`]), starts
//!    the holder in CRI's netns with new IPC/UTS(/PID) namespaces ([`holder`]), pins them, writes
//!    the pod files and mounts the pod's /dev/shm ([`pod::files`]).
//! 3. Containers arrive as tasks ([`service::task`]): their `config.json` is rewritten to point at
//!    the pod's namespaces and files ([`task::oci`]) and they run through runc ([`task::runc`]).
//! 4. `StopSandbox` kills what is left; `WaitSandbox` returns; the pod is NOTREADY.
//! 5. `ShutdownSandbox` releases every mount, pin, process and file, and the shim exits;
//!    containerd then runs `delete` ([`shim::delete`]), which cleans whatever may remain.
//!
//! Module map:
//! - [`config`]: corral's settings (TOML file, environment overrides).
//! - [`doctor`]: checks a node's setup for corral.
//! - [`error`]: the crate error and its one mapping to ttrpc codes.
//! - [`ids`]: the one check of containerd's ids.
//! - [`node`]: node mode's shared server on disk: socket, lock, registrations.
//! - [`shim`]: containerd's binary protocol (flags, start, delete, server, logging); knows no pods.
//! - [`service`]: ttrpc adapters for the Sandbox and Task services.
//! - [`pod`]: the sandbox itself: spec, state, files, the registry keyed by sandbox id.
//! - [`holder`]: the process holding the pod's namespaces, and the namespace pins.
//! - [`task`]: the pod's containers through runc; config.json rewriting; process exits.
//! - [`events`]: task events forwarded to containerd.
//! - [`cgroups`]: the pod cgroup (holder), resources, v1/v2 metrics.
//! - [`sys`]: thin safe wrappers over the syscalls nix does not cover.

pub mod cgroups;
pub mod config;
pub mod doctor;
pub mod error;
pub mod events;
pub mod holder;
pub mod ids;
pub mod node;
pub mod pod;
pub mod service;
pub mod shim;
pub mod sys;
pub mod task;

pub use error::{Error, Result};
