//! A process's stdio, from the URIs containerd sends: FIFO paths (CRI; `fifo://` too), `file://`
//! paths and `binary://` logging programs (ctr/nerdctl), or nothing.
//!
//! Output FIFOs are handed straight to the process: no copy loop runs in corral. They are opened
//! write-only once containerd's reader is there (CRI opens it before Task.Create), so the reader
//! sees EOF when the process exits. corral also keeps a read-only, never-read fd on each output
//! FIFO for the process's life: while containerd restarts the FIFO still has a reader, so the
//! process blocks on a full pipe instead of dying of SIGPIPE, and containerd reads what was written
//! once it is back.
//!
//! stdin is copied: containerd's FIFO into a pipe the process reads (or into its terminal), so
//! that CloseIO can give the process its end of file whenever containerd asks.
//!
//! `file://` output is copied by corral: the process gets a pipe, never the host file (see
//! [`super::copy`]).
//!
//! A tty process has one output stream, pumped from its terminal by [`super::console`]; this
//! module gives that pump its destination with [`open_for_console`].

use std::fs::{File, OpenOptions};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

use crate::error::{Error, IoContext, Result};
use crate::task::console::Console;
use crate::task::copy::{self, Flusher};
use crate::task::logger::{Logger, LoggerSpec};
use crate::task::runc::CreateIo;

/// Where one stream goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    Null,
    Fifo(PathBuf),
    File(PathBuf),
    Binary(LoggerSpec),
}

/// Parses a stdio URI; `field` names it in errors.
pub fn target(field: &str, uri: &str) -> Result<Target> {
    if uri.is_empty() {
        return Ok(Target::Null);
    }
    let (scheme, rest) = match uri.split_once("://") {
        Some((scheme, rest)) => (scheme, rest),
        None => ("fifo", uri),
    };
    if scheme == "binary" {
        if field == "stdin" {
            return Err(Error::invalid(format!("{field}: binary:// is for output streams")));
        }
        return LoggerSpec::parse(field, rest).map(Target::Binary);
    }
    if !matches!(scheme, "fifo" | "file") {
        return Err(Error::invalid(format!(
            "{field}: unknown stdio scheme {scheme}:// (fifo, file, binary)"
        )));
    }
    let path = PathBuf::from(rest);
    if !path.is_absolute() {
        return Err(Error::invalid(format!("{field}: {uri:?} is not an absolute path")));
    }
    match scheme {
        "file" if field == "stdin" => Err(Error::invalid(format!("{field}: file:// is for output streams"))),
        "file" => Ok(Target::File(path)),
        _ => Ok(Target::Fifo(path)),
    }
}

/// The stdio a process was created with, as containerd named it.
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

impl Request {
    /// The stdio of a Create or Exec request, checked.
    pub fn checked(stdin: &str, stdout: &str, stderr: &str, terminal: bool) -> Result<Request> {
        let req = Request { stdin: stdin.into(), stdout: stdout.into(), stderr: stderr.into(), terminal };
        req.validate()?;
        Ok(req)
    }

    /// Checks every URI up front, so a bad one is refused before anything runs.
    pub fn validate(&self) -> Result<()> {
        target("stdin", &self.stdin)?;
        let stdout = target("stdout", &self.stdout)?;
        let stderr = target("stderr", &self.stderr)?;
        // A logging program takes both streams, as containerd's shims do.
        if matches!(stdout, Target::Binary(_)) && !(stderr == Target::Null || stderr == stdout) {
            return Err(Error::invalid("stderr: must be empty or the same binary:// URI as stdout"));
        }
        Ok(())
    }
}

/// What corral holds for a process's stdio while it lives.
#[derive(Default)]
pub struct Kept {
    /// Readers on output FIFOs (see the module doc).
    pub readers: Vec<File>,
    pub stdin: Option<StdinHandle>,
    pub console: Option<Console>,
    pub logger: Option<Logger>,
    /// corral's copies of `file://` output, to flush before the exit is published.
    pub file_copies: Vec<Flusher>,
}

impl Kept {
    /// Every copy of the process's output that runs in corral (files, the terminal).
    pub fn flushers(&self) -> Vec<Flusher> {
        let mut all = self.file_copies.clone();
        all.extend(self.console.as_ref().map(Console::flusher));
        all
    }

    /// CloseIO: the process gets its end of input once what containerd wrote is delivered.
    pub fn close_stdin(&mut self) {
        if let Some(stdin) = &mut self.stdin {
            if let Some(close) = stdin.close.take() {
                let _ = close.send(());
            }
        }
    }

    /// The process is deleted: stop copying, hang its terminal up, let its logger finish. File
    /// copies run on until their pipe's last writer is gone (they were flushed at the exit).
    pub fn release(self) {
        if let Some(task) = self.stdin.and_then(|s| s.task) {
            task.abort();
        }
        if let Some(console) = self.console {
            console.close();
        }
        if let Some(logger) = self.logger {
            logger.stop();
        }
    }
}

/// Controls a running stdin copy.
pub struct StdinHandle {
    close: Option<oneshot::Sender<()>>,
    /// Set when the copy runs in its own task (not inside a console pump).
    task: Option<tokio::task::AbortHandle>,
}

/// containerd's stdin FIFO, to be copied to the process until CloseIO.
pub struct StdinCopy {
    source: tokio::net::unix::pipe::Receiver,
    close: oneshot::Receiver<()>,
}

impl StdinCopy {
    /// Copies until CloseIO, then delivers what containerd wrote before it and returns (the
    /// caller then closes the sink: the process's end of file).
    pub async fn run(mut self, mut sink: impl AsyncWrite + Unpin) {
        let mut buf = vec![0u8; 8192];
        loop {
            tokio::select! {
                biased;
                read = self.source.read(&mut buf) => match read {
                    Ok(n @ 1..) => if sink.write_all(&buf[..n]).await.is_err() { return },
                    _ => return,
                },
                _ = &mut self.close => {
                    while let Ok(n @ 1..) = self.source.try_read(&mut buf) {
                        if sink.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
            }
        }
    }
}

/// Opens containerd's stdin FIFO for copying; `None` when the process has no stdin.
fn open_stdin(uri: &str) -> Result<Option<(StdinCopy, oneshot::Sender<()>)>> {
    let Target::Fifo(path) = target("stdin", uri)? else { return Ok(None) };
    // Read-write: the open never waits for containerd's writer, and no early end of file is
    // seen before it comes; the end of input is CloseIO's to decide.
    let source = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(&path)
        .with_path("open stdin", &path)?;
    let (tx, rx) = oneshot::channel();
    Ok(Some((StdinCopy { source, close: rx }, tx)))
}

/// Opens the three streams of a process without a terminal; `process_id` and `namespace` are
/// given to a logging program.
pub async fn open(req: &Request, process_id: &str, namespace: &str) -> Result<(CreateIo, Kept)> {
    req.validate()?;
    let mut kept = Kept::default();
    let (stdout, stderr) = match target("stdout", &req.stdout)? {
        Target::Binary(spec) => {
            let (logger, pipes) = Logger::start(&spec, process_id, namespace).await?;
            kept.logger = Some(logger);
            (Stdio::from(pipes.stdout), Stdio::from(pipes.stderr))
        }
        // One file for both streams (ctr's --log-uri): one pipe, so the file keeps the order in
        // which the process wrote them.
        Target::File(path) if req.stderr == req.stdout => {
            let write = file_pipe("stdout", &path, &mut kept)?;
            let for_stderr = write.try_clone().context(|| "duplicate the output pipe".into())?;
            (Stdio::from(write), Stdio::from(for_stderr))
        }
        _ => (open_output("stdout", &req.stdout, &mut kept)?, open_output("stderr", &req.stderr, &mut kept)?),
    };
    let stdin = match open_stdin(&req.stdin)? {
        Some((copy, close)) => {
            let (read, write) =
                nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::sys("create stdin pipe", e))?;
            let sink =
                tokio::net::unix::pipe::Sender::from_owned_fd(write).context(|| "stdin pipe".into())?;
            let task = tokio::spawn(copy.run(sink)).abort_handle();
            kept.stdin = Some(StdinHandle { close: Some(close), task: Some(task) });
            Stdio::from(read)
        }
        None => Stdio::null(),
    };
    Ok((CreateIo { stdin, stdout, stderr, console_socket: None }, kept))
}

/// One output stream handed to the process as it is.
fn open_output(field: &str, uri: &str, kept: &mut Kept) -> Result<Stdio> {
    Ok(match target(field, uri)? {
        Target::Null | Target::Binary(_) => Stdio::null(),
        Target::File(path) => Stdio::from(file_pipe(field, &path, kept)?),
        Target::Fifo(path) => {
            kept.readers.push(keep_reader(field, &path)?);
            // Never blocks or fails for want of a reader: corral holds one.
            let file = OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .and_then(blocking)
                .with_path(&format!("open {field}"), &path)?;
            Stdio::from(file)
        }
    })
}

/// The write end of a pipe whose reader corral copies into the file at `path`.
fn file_pipe(field: &str, path: &Path, kept: &mut Kept) -> Result<OwnedFd> {
    let file = open_file(field, path)?;
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| Error::sys(format!("create the {field} pipe"), e))?;
    kept.file_copies.push(copy::to_file(read, file, path.to_path_buf())?);
    Ok(write)
}

/// The stdin copy and output destination of a terminal's pumps.
pub struct ConsoleIo {
    pub stdin: Option<StdinCopy>,
    pub output: Box<dyn AsyncWrite + Send + Unpin>,
}

/// Opens the streams of a tty process: its stdin copy and where the terminal's output goes.
pub async fn open_for_console(req: &Request, process_id: &str, namespace: &str) -> Result<(ConsoleIo, Kept)> {
    req.validate()?;
    let mut kept = Kept::default();
    let output: Box<dyn AsyncWrite + Send + Unpin> = match target("stdout", &req.stdout)? {
        Target::Null => Box::new(tokio::io::sink()),
        Target::File(path) => Box::new(tokio::fs::File::from_std(open_file("stdout", &path)?)),
        Target::Fifo(path) => {
            kept.readers.push(keep_reader("stdout", &path)?);
            Box::new(
                tokio::net::unix::pipe::OpenOptions::new()
                    .open_sender(&path)
                    .with_path("open stdout", &path)?,
            )
        }
        Target::Binary(spec) => {
            let (logger, pipes) = Logger::start(&spec, process_id, namespace).await?;
            kept.logger = Some(logger);
            // The terminal has no stderr: the program sees its end of file at once.
            drop(pipes.stderr);
            Box::new(
                tokio::net::unix::pipe::Sender::from_owned_fd(pipes.stdout)
                    .context(|| "logger stdout pipe".into())?,
            )
        }
    };
    let stdin = open_stdin(&req.stdin)?.map(|(copy, close)| {
        kept.stdin = Some(StdinHandle { close: Some(close), task: None });
        copy
    });
    Ok((ConsoleIo { stdin, output }, kept))
}

/// A read-only, never-read fd that keeps a FIFO's reader side open (see the module doc).
fn keep_reader(field: &str, path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_path(&format!("open {field} for keeping"), path)
}

fn open_file(field: &str, path: &Path) -> Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_path(&format!("create {field} directory"), dir)?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
        .with_path(&format!("open {field}"), path)
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
        assert!(matches!(target("stdout", "binary:///usr/bin/logger?a=b").unwrap(), Target::Binary(_)));
        assert!(target("stdin", "binary:///usr/bin/logger")
            .unwrap_err()
            .to_string()
            .contains("output streams"));
        assert!(target("stdout", "tcp://1.2.3.4").unwrap_err().to_string().contains("unknown stdio scheme"));
        assert!(target("stdout", "relative/path").unwrap_err().to_string().contains("not an absolute path"));
    }

    #[test]
    fn a_logger_takes_both_output_streams() {
        let req = |stdout: &str, stderr: &str, terminal| Request {
            stdin: String::new(),
            stdout: stdout.into(),
            stderr: stderr.into(),
            terminal,
        };
        assert!(req("/run/o", "/run/e", false).validate().is_ok());
        assert!(req("/run/o", "", true).validate().is_ok());
        // A terminal has one output stream; stderr is ignored, as containerd's shims do.
        assert!(req("/run/o", "/run/e", true).validate().is_ok());
        assert!(req("binary:///l", "binary:///l", false).validate().is_ok());
        let err = req("binary:///l", "/run/e", false).validate().unwrap_err().to_string();
        assert!(err.starts_with("stderr:") && err.contains("binary://"), "{err}");
    }
}
