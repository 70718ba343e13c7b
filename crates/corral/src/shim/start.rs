//! `start`: bind the socket (mode 0600), spawn the detached server with the listening socket as
//! fd 3, wait until it says it serves, print the bootstrap JSON, exit. containerd reads stdout and
//! stderr together until EOF, so the server gets neither.
//!
//! In node mode (`shim.mode = "node"`) every sandbox gets the address of the node's one server:
//! `start` registers the sandbox with it (see [`crate::node`]) and spawns it only if none runs.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::args::Args;
use super::bootstrap;
use crate::config::{Mode, RuntimeOptions};
use crate::error::{Error, IoContext, Result};
use crate::node::{NodeServer, NODE_DIR};

/// Default directory for shim sockets (short, so paths stay under the unix socket limit).
pub const SOCKET_DIR: &str = "/run/corral/s";
/// fds the server finds its listener and readiness pipe on.
pub const LISTEN_FD: i32 = 3;
pub const READY_FD: i32 = 4;

/// A stable socket path for (containerd address, namespace, id), like containerd's own shims.
/// The parts are joined with a NUL, which none of them can contain, so distinct triples never
/// hash the same input ("ab"+"c" and "a"+"bc" would without a separator).
pub fn socket_path(dir: &Path, address: &str, namespace: &str, id: &str) -> PathBuf {
    let digest = Sha256::digest(format!("{address}\0{namespace}\0{id}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    dir.join(hex)
}

pub fn run(args: &Args) -> Result<()> {
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let input = bootstrap::parse_stdin(&stdin, &args.id)?;
    let options = match &input.options {
        Some((type_url, value)) => RuntimeOptions::from_any(type_url, value)?,
        None => None,
    };
    // A bad configuration fails here, where containerd shows the message in RunPodSandbox's error.
    let config = crate::config::init(options.as_ref())?;
    let bundle = match &args.bundle {
        Some(b) => b.clone(),
        None => std::env::current_dir().context(|| "current directory".into())?,
    };
    if let Some(options) = &options {
        options.save(&bundle)?;
    }
    let dir = PathBuf::from(input.socket_dir.unwrap_or_else(|| SOCKET_DIR.to_string()));
    match mode(config) {
        Mode::Pod => {
            let socket = socket_path(&dir, &args.address, &args.namespace, &args.id);
            ensure_server(args, &socket, None, &bundle)?;
            print_reply(&socket)
        }
        Mode::Node => {
            let node = NodeServer::locate(&dir, Path::new(NODE_DIR), &args.address, &args.namespace, config);
            start_node(args, &node, options.as_ref(), &bundle)?;
            print_reply(&node.socket)
        }
    }
}

/// The mode for this sandbox: `CORRAL_MODE`, else the name corral was run under, else the
/// configuration. A handler whose runtime_type is `io.containerd.corral-node.v2` runs
/// `containerd-shim-corral-node-v2` (a link to this binary): so one containerd can offer both
/// modes side by side, which a handler's options cannot do on containerd 2.1.
fn mode(config: &crate::config::Config) -> Mode {
    let name = std::env::args_os().next().map(PathBuf::from);
    let by_name = name.as_deref().and_then(Path::file_name).is_some_and(|n| n == super::NODE_BINARY_NAME);
    match std::env::var_os("CORRAL_MODE") {
        None if by_name => Mode::Node,
        _ => config.shim.mode,
    }
}

/// Node mode: registers the sandbox with the node's server, starting the server if none runs.
/// Under the node's lock, so concurrent `start`s end with one server and the server cannot
/// decide to exit between the check and the registration.
fn start_node(args: &Args, node: &NodeServer, options: Option<&RuntimeOptions>, bundle: &Path) -> Result<()> {
    let _lock = node.lock()?;
    node.register(&args.id, bundle)?;
    let started = node.save_marker(bundle).and_then(|()| node.save_socket_path()).and_then(|()| {
        if let Some(options) = options {
            options.save(&node.dir)?;
        }
        ensure_server(args, &node.socket, Some(node), bundle)
    });
    if started.is_err() {
        node.deregister(&args.id);
        let _ = std::fs::remove_file(bundle.join(crate::node::MARKER_FILE));
    }
    started
}

/// Makes sure a server listens on `socket`: reuses a live one (containerd retried `start`, or
/// node mode's shared server), else binds the socket and spawns one, waiting until it serves.
fn ensure_server(args: &Args, socket: &Path, node: Option<&NodeServer>, bundle: &Path) -> Result<()> {
    if socket.exists() {
        if UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        std::fs::remove_file(socket).with_path("remove stale socket", socket)?;
    }
    let dir = socket.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).with_path("create socket directory", dir)?;
    let listener = bind_private(socket)?;

    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::sys("create readiness pipe", e))?;
    let workdir = node.map_or(bundle, |n| n.dir.as_path());
    let spawned = spawn_server(args, socket, node.is_some(), workdir, listener.into(), ready_w);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let _ = std::fs::remove_file(socket);
            return Err(e);
        }
    };
    // The server writes one byte once its services are registered and it accepts.
    let mut ready = std::fs::File::from(ready_r);
    let mut byte = [0u8; 1];
    match read_with_timeout(&mut ready, &mut byte, Duration::from_secs(10)) {
        Ok(1) => Ok(()),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(socket);
            Err(Error::Holder {
                step: "start server".into(),
                message: format!("the server did not become ready: {other:?}"),
            })
        }
    }
}

fn print_reply(socket: &Path) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bootstrap::reply_json(socket).as_bytes()).context(|| "write bootstrap reply".into())?;
    out.flush().context(|| "flush bootstrap reply".into())
}

/// Binds with umask 0177 so the socket is 0600 from its first instant.
fn bind_private(socket: &Path) -> Result<UnixListener> {
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(socket);
    nix::sys::stat::umask(old);
    bound.with_path("bind", socket)
}

/// Spawns the server in `workdir` (the pod's bundle, or the node directory): `serve -id <sb>`
/// for one pod, `serve-node` (no id: no pod's `delete` may take it for its own) for the node.
fn spawn_server(
    args: &Args,
    socket: &Path,
    node: bool,
    workdir: &Path,
    listener: OwnedFd,
    ready_w: OwnedFd,
) -> Result<std::process::Child> {
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0(super::BINARY_NAME).current_dir(workdir);
    cmd.arg("-namespace").arg(&args.namespace).arg("-address").arg(&args.address);
    cmd.arg("-publish-binary").arg(&args.publish_binary);
    if !node {
        cmd.arg("-id").arg(&args.id);
    }
    cmd.arg("-socket").arg(socket);
    if args.debug {
        cmd.arg("-debug");
    }
    cmd.arg(if node { "serve-node" } else { "serve" });
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    let (lfd, rfd) = (listener.as_raw_fd(), ready_w.as_raw_fd());
    // SAFETY: between fork and exec this only calls async-signal-safe functions (fcntl, dup2,
    // setsid) on fds that stay open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            // Move both fds out of the way first, then into place without CLOEXEC.
            let l = libc::fcntl(lfd, libc::F_DUPFD_CLOEXEC, 64);
            let r = libc::fcntl(rfd, libc::F_DUPFD_CLOEXEC, 64);
            if l < 0 || r < 0 || libc::dup2(l, LISTEN_FD) < 0 || libc::dup2(r, READY_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Its own session: containerd's process group kill of `start` must not reach it.
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().context(|| "spawn shim server".into())?;
    drop(listener);
    drop(ready_w);
    Ok(child)
}

fn read_with_timeout(file: &mut std::fs::File, buf: &mut [u8], timeout: Duration) -> std::io::Result<usize> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(timeout.as_millis() as i32).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, ms)? {
        0 => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out")),
        _ => file.read(buf),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_path_is_stable_short_and_distinct() {
        let a =
            socket_path(Path::new(SOCKET_DIR), "/run/containerd/containerd.sock", "k8s.io", &"a".repeat(64));
        let b =
            socket_path(Path::new(SOCKET_DIR), "/run/containerd/containerd.sock", "k8s.io", &"b".repeat(64));
        assert_eq!(
            a,
            socket_path(Path::new(SOCKET_DIR), "/run/containerd/containerd.sock", "k8s.io", &"a".repeat(64))
        );
        assert_ne!(a, b);
        assert!(a.as_os_str().len() < 108, "unix socket paths are limited to 107 bytes");
        // Without a separator these two would hash the same string.
        assert_ne!(
            socket_path(Path::new(SOCKET_DIR), "/a.sock", "k8s", "io-x"),
            socket_path(Path::new(SOCKET_DIR), "/a.sock", "k8si", "o-x")
        );
    }
}
