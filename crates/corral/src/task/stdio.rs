//! The container's stdio: containerd's FIFOs handed straight to the container's init.
//!
//! No copy loop runs in corral: the init writes into the FIFO containerd reads. stdout and stderr
//! are opened write-only once containerd's reader is there (CRI opens it before Task.Create), so
//! the reader sees EOF when the container exits.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Stdio;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::error::{Error, IoContext, Result};
use crate::task::runc::CreateIo;

/// Opens the three stdio paths of a Create request ("" = /dev/null).
pub fn open(stdin: &str, stdout: &str, stderr: &str) -> Result<CreateIo> {
    Ok(CreateIo {
        stdin: open_one("stdin", stdin, Direction::In)?,
        stdout: open_one("stdout", stdout, Direction::Out)?,
        stderr: open_one("stderr", stderr, Direction::Out)?,
    })
}

enum Direction {
    In,
    Out,
}

fn open_one(field: &str, uri: &str, dir: Direction) -> Result<Stdio> {
    if uri.is_empty() {
        return Ok(Stdio::null());
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
    let file = match dir {
        // Read-write keeps the open from blocking before containerd's writer appears.
        Direction::In => OpenOptions::new().read(true).write(true).open(path),
        Direction::Out => OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path),
    };
    let file = match (file, dir) {
        (Ok(f), Direction::Out) => blocking(f),
        (Ok(f), Direction::In) => Ok(f),
        // No reader yet (ENXIO): hold both ends rather than fail the container.
        (Err(e), Direction::Out) if e.raw_os_error() == Some(libc::ENXIO) => {
            OpenOptions::new().read(true).write(true).open(path)
        }
        (Err(e), _) => Err(e),
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
