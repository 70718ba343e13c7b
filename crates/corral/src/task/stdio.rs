//! The container's stdio: containerd's FIFOs handed straight to the container's init.
//!
//! No copy loop runs in corral: the init writes into the FIFO containerd reads. stdout and stderr
//! are opened write-only once containerd's reader is there (CRI opens it before Task.Create), so
//! the reader sees EOF when the container exits. corral also keeps a read-only fd on each output
//! FIFO for the process's life and never reads it: while containerd restarts, the FIFO still has
//! a reader, so the container blocks on a full pipe instead of dying of SIGPIPE, and containerd
//! reads what was written once it is back.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Stdio;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::error::{Error, IoContext, Result};
use crate::task::runc::CreateIo;

/// Opens the three stdio paths of a Create request ("" = /dev/null). Returns the process's
/// stdio and the reader fds corral keeps (see the module doc).
pub fn open(stdin: &str, stdout: &str, stderr: &str) -> Result<(CreateIo, Vec<File>)> {
    let mut keep = Vec::new();
    for (field, path) in [("stdout", stdout), ("stderr", stderr)] {
        if let Some(path) = fifo_path(field, path)? {
            let reader = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)
                .with_path(&format!("open {field} for keeping"), path)?;
            keep.push(reader);
        }
    }
    let io = CreateIo {
        stdin: open_one("stdin", stdin, Direction::In)?,
        stdout: open_one("stdout", stdout, Direction::Out)?,
        stderr: open_one("stderr", stderr, Direction::Out)?,
    };
    Ok((io, keep))
}

/// The FIFO path of a stdio URI, or None for "".
fn fifo_path<'a>(field: &str, uri: &'a str) -> Result<Option<&'a Path>> {
    if uri.is_empty() {
        return Ok(None);
    }
    if let Some((scheme, _)) = uri.split_once("://") {
        if scheme != "fifo" {
            return Err(Error::Unimplemented(format!(
                "{field}: {scheme}:// stdio is not supported yet (FIFO paths only)"
            )));
        }
    }
    let path = Path::new(uri.strip_prefix("fifo://").unwrap_or(uri));
    if !path.is_absolute() {
        return Err(Error::invalid(format!(
            "{field}: {uri:?} is not an absolute path"
        )));
    }
    Ok(Some(path))
}

enum Direction {
    In,
    Out,
}

fn open_one(field: &str, uri: &str, dir: Direction) -> Result<Stdio> {
    let Some(path) = fifo_path(field, uri)? else {
        return Ok(Stdio::null());
    };
    let file = match dir {
        // Read-write keeps the open from blocking before containerd's writer appears.
        Direction::In => OpenOptions::new().read(true).write(true).open(path),
        // Never blocks or fails for want of a reader: corral holds one (see `open`).
        Direction::Out => OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .and_then(blocking),
    }
    .with_path(&format!("open {field}"), path)?;
    Ok(Stdio::from(file))
}

/// The container expects blocking writes.
fn blocking(file: File) -> std::io::Result<File> {
    let flags = OFlag::from_bits_truncate(fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&file),
        FcntlArg::F_GETFL,
    )?);
    fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&file),
        FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK),
    )?;
    Ok(file)
}
