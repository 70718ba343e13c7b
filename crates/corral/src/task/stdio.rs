//! A process's stdio, from the URIs containerd sends: FIFO paths (CRI; `fifo://` too), `file://`
//! paths (ctr/nerdctl logs), or nothing.
//!
//! Output FIFOs are handed straight to the process: no copy loop runs in corral. They are opened
//! write-only once containerd's reader is there (CRI opens it before Task.Create), so the reader
//! sees EOF when the process exits. corral also keeps a read-only, never-read fd on each output
//! FIFO for the process's life: while containerd restarts the FIFO still has a reader, so the
//! process blocks on a full pipe instead of dying of SIGPIPE, and containerd reads what was written
//! once it is back.
//!
//! stdin is the one copy: containerd's FIFO is copied into a pipe the process reads, so that
//! CloseIO can give the process its end of file whenever containerd asks.

use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::error::{Error, IoContext, Result};
use crate::task::runc::CreateIo;

/// Where one stream goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Null,
    Fifo(PathBuf),
    File(PathBuf),
}

/// Parses a stdio URI; `field` names it in errors.
pub fn target(field: &str, uri: &str) -> Result<Target> {
    if uri.is_empty() {
        return Ok(Target::Null);
    }
    let (scheme, path) = match uri.split_once("://") {
        Some((scheme, path)) => (scheme, path),
        None => ("fifo", uri),
    };
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(Error::invalid(format!("{field}: {uri:?} is not an absolute path")));
    }
    match scheme {
        "fifo" => Ok(Target::Fifo(path)),
        "file" if field != "stdin" => Ok(Target::File(path)),
        "file" => Err(Error::invalid(format!("{field}: file:// is for output streams"))),
        other => Err(Error::Unimplemented(format!("{field}: {other}:// stdio is not supported yet"))),
    }
}

/// What corral holds for a process's stdio while it lives.
#[derive(Default)]
pub struct Kept {
    /// Readers on output FIFOs (see the module doc).
    pub readers: Vec<File>,
    /// The stdin copy; aborting it closes the process's stdin.
    pub stdin: Option<tokio::task::AbortHandle>,
}

/// Opens the three streams of a Create or Exec request.
pub fn open(stdin: &str, stdout: &str, stderr: &str) -> Result<(CreateIo, Kept)> {
    let mut kept = Kept::default();
    let mut outputs = Vec::new();
    for (field, uri) in [("stdout", stdout), ("stderr", stderr)] {
        outputs.push(match target(field, uri)? {
            Target::Null => Stdio::null(),
            Target::File(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).with_path(&format!("create {field} directory"), dir)?;
                }
                let file = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o640)
                    .open(&path)
                    .with_path(&format!("open {field}"), &path)?;
                Stdio::from(file)
            }
            Target::Fifo(path) => {
                let reader = OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&path)
                    .with_path(&format!("open {field} for keeping"), &path)?;
                kept.readers.push(reader);
                // Never blocks or fails for want of a reader: corral holds one.
                let file = OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&path)
                    .and_then(blocking)
                    .with_path(&format!("open {field}"), &path)?;
                Stdio::from(file)
            }
        });
    }
    let stdin = match target("stdin", stdin)? {
        Target::Fifo(path) => {
            let (read, task) = copy_stdin(&path)?;
            kept.stdin = Some(task);
            Stdio::from(read)
        }
        _ => Stdio::null(),
    };
    let stderr = outputs.pop().expect("two outputs");
    let stdout = outputs.pop().expect("two outputs");
    Ok((CreateIo { stdin, stdout, stderr }, kept))
}

/// A pipe for the process's stdin, fed from containerd's FIFO by a task.
fn copy_stdin(fifo: &Path) -> Result<(OwnedFd, tokio::task::AbortHandle)> {
    // Read-write: the open never waits for containerd's writer, and no early end of file is
    // seen before it comes; the end of input is CloseIO's to decide.
    let mut source = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(fifo)
        .with_path("open stdin", fifo)?;
    let (read, write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::sys("create stdin pipe", e))?;
    let mut sink = tokio::net::unix::pipe::Sender::from_owned_fd(write).context(|| "stdin pipe".into())?;
    let task = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut source, &mut sink).await;
    });
    Ok((read, task.abort_handle()))
}

/// The process expects blocking writes.
fn blocking(file: File) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    let flags = OFlag::from_bits_truncate(fcntl(file.as_raw_fd(), FcntlArg::F_GETFL)?);
    fcntl(file.as_raw_fd(), FcntlArg::F_SETFL(flags - OFlag::O_NONBLOCK))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stdio_uris() {
        assert_eq!(target("stdout", "").unwrap(), Target::Null);
        assert_eq!(target("stdout", "/run/x/stdout").unwrap(), Target::Fifo("/run/x/stdout".into()));
        assert_eq!(target("stdout", "fifo:///run/x").unwrap(), Target::Fifo("/run/x".into()));
        assert_eq!(target("stderr", "file:///var/log/c.log").unwrap(), Target::File("/var/log/c.log".into()));
        assert!(target("stdin", "file:///etc/passwd").unwrap_err().to_string().contains("output streams"));
        assert!(matches!(target("stdout", "binary:///usr/bin/logger").unwrap_err(), Error::Unimplemented(_)));
        assert!(target("stdout", "relative/path").unwrap_err().to_string().contains("not an absolute path"));
    }
}
