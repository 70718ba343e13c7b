//! Terminals of tty processes (Create or Exec with `terminal = true`).
//!
//! runc makes the pty inside the container and hands its master to whoever listens on the
//! `--console-socket` it is given (one SCM_RIGHTS message). corral then pumps bytes between the
//! master and containerd's streams: stdin FIFO -> master, master -> stdout (a tty has no separate
//! stderr). This is the one place corral copies output, because a pty master cannot be handed to
//! containerd the way a FIFO can.
//!
//! End of a session, as containerd's own shim behaves: the output pump ends when the process side
//! of the pty is gone (the master reads EIO) and then closes stdout, which is containerd's end of
//! file. CloseIO on stdin copies what containerd already wrote and then hangs the terminal up
//! (closes the master), which is how `kubectl exec -it` ends a shell whose client went away.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Notify;

use crate::error::{Error, IoContext, Result};
use crate::task::copy::{flush_channel, FlushRequests, Flusher};
use crate::task::stdio::StdinCopy;

/// Short, so the socket path stays far below the 108-byte limit of a unix socket address.
const SOCKET_DIR: &str = "/run/corral/c";

/// How long runc has to send the master once it has returned.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A listening socket for runc's `--console-socket`; removed when dropped.
pub struct ConsoleSocket {
    path: PathBuf,
    listener: tokio::net::UnixListener,
}

impl ConsoleSocket {
    pub fn bind() -> Result<ConsoleSocket> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = Path::new(SOCKET_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_path("create console socket directory", dir)?;
        let path = dir.join(format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).with_path("bind console socket", &path)?;
        Ok(ConsoleSocket { path, listener })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pty master runc sent. Call once runc has returned: its message is then already queued.
    pub async fn receive(&self) -> Result<OwnedFd> {
        let received = tokio::time::timeout(RECEIVE_TIMEOUT, async {
            let (stream, _) = self.listener.accept().await?;
            loop {
                stream.readable().await?;
                match stream.try_io(tokio::io::Interest::READABLE, || receive_fd(stream.as_raw_fd())) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    other => return other,
                }
            }
        })
        .await;
        match received {
            Ok(result) => result.with_path("receive the pty master from", &self.path),
            Err(_) => Err(Error::io(
                format!("receive the pty master from {}", self.path.display()),
                io::Error::new(io::ErrorKind::TimedOut, "runc sent no terminal"),
            )),
        }
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Reads one message carrying one fd (runc sends the pty's name as the data).
fn receive_fd(socket: RawFd) -> io::Result<OwnedFd> {
    let mut name = [0u8; 4096];
    let mut iov = [io::IoSliceMut::new(&mut name)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(socket, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            let mut fds = fds.into_iter();
            if let Some(fd) = fds.next() {
                // SAFETY: the kernel just installed these fds in this process for us alone.
                let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
                for extra in fds {
                    // SAFETY: as above; an extra fd is not ours to keep.
                    drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(extra) });
                }
                return Ok(owned);
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "the message carried no file descriptor"))
}

/// A process's terminal while it lives: the master and the two pumps.
pub struct Console {
    shared: Arc<Shared>,
    pumps: Vec<tokio::task::AbortHandle>,
    /// Asks the output pump to write out what the terminal holds (at the process's exit).
    flusher: Flusher,
}

struct Shared {
    /// Taken on hang-up; the pumps hold their own references while they run, so the master
    /// closes (the process's side sees the hang-up) once they are done too.
    master: Mutex<Option<Arc<AsyncFd<OwnedFd>>>>,
    hung_up: Notify,
}

impl Shared {
    fn hang_up(&self) {
        self.master.lock().unwrap().take();
        self.hung_up.notify_one();
    }
}

impl Console {
    /// Starts pumping: `stdin` (containerd's FIFO copy, if any) into the master and the master
    /// into `output`.
    pub fn start(
        master: OwnedFd,
        stdin: Option<StdinCopy>,
        output: Box<dyn AsyncWrite + Send + Unpin>,
    ) -> Result<Console> {
        let flags = nix::fcntl::fcntl(master.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)
            .context(|| "read pty master flags".into())?;
        let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(master.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))
            .context(|| "make the pty master non-blocking".into())?;
        // SAFETY: the OwnedFd moves into the AsyncFd, so it stays open and names the same master
        // for the AsyncFd's whole life.
        let master = unsafe { AsyncFd::register(master) }.map_err(|e| e.into_parts().1);
        let master = Arc::new(master.context(|| "register the pty master".into())?);
        let shared = Arc::new(Shared { master: Mutex::new(Some(master.clone())), hung_up: Notify::new() });
        let mut pumps = Vec::new();
        if let Some(stdin) = stdin {
            let (master, shared) = (master.clone(), shared.clone());
            pumps.push(
                tokio::spawn(async move {
                    stdin.run(Master(master)).await;
                    // containerd closed stdin (CloseIO): hang the terminal up.
                    shared.hang_up();
                })
                .abort_handle(),
            );
        }
        let (flusher, requests) = flush_channel();
        pumps.push(tokio::spawn(pump_output(master, output, shared.clone(), requests)).abort_handle());
        Ok(Console { shared, pumps, flusher })
    }

    pub fn flusher(&self) -> Flusher {
        self.flusher.clone()
    }

    /// Sets the terminal's size (ResizePty).
    pub fn resize(&self, width: u32, height: u32) -> Result<()> {
        let guard = self.shared.master.lock().unwrap();
        let master = guard.as_ref().ok_or_else(|| Error::precondition("the terminal was hung up"))?;
        let size = libc::winsize {
            ws_row: u16::try_from(height)
                .map_err(|_| Error::invalid(format!("height: {height} is too large")))?,
            ws_col: u16::try_from(width)
                .map_err(|_| Error::invalid(format!("width: {width} is too large")))?,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which outlives the call.
        let rc = unsafe { libc::ioctl(master.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &size) };
        if rc < 0 {
            return Err(Error::io("set the terminal size", io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Ends the session at once (the process was deleted).
    pub fn close(&self) {
        self.shared.hang_up();
        for pump in &self.pumps {
            pump.abort();
        }
    }
}

/// How long a flush at the process's exit waits for the terminal's end of file. What a process
/// writes to its terminal reaches the master through the kernel's flip buffer, a moment later;
/// the end of file (EIO) comes only after that buffer is delivered, so it is the sure sign that
/// all is read. When something else still holds the terminal there is no end of file, and what
/// the master holds after this grace is written out instead.
const EXIT_GRACE: Duration = Duration::from_millis(100);

/// master -> output until the process side is gone or the terminal is hung up.
async fn pump_output(
    master: Arc<AsyncFd<OwnedFd>>,
    mut output: Box<dyn AsyncWrite + Send + Unpin>,
    shared: Arc<Shared>,
    mut requests: FlushRequests,
) {
    use tokio::io::AsyncReadExt;
    let mut reader = Master(master);
    let mut buf = vec![0u8; 32 * 1024];
    // Flush requests not answered yet, and when the grace for them ends.
    let mut pending = Vec::new();
    let grace = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(grace);
    loop {
        let n = tokio::select! {
            read = reader.read(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = shared.hung_up.notified() => {
                drain(&reader.0, &mut buf, &mut output).await;
                break;
            }
            ack = requests.next() => {
                if pending.is_empty() {
                    grace.as_mut().reset(tokio::time::Instant::now() + EXIT_GRACE);
                }
                pending.push(ack);
                continue;
            }
            _ = &mut grace, if !pending.is_empty() => {
                drain(&reader.0, &mut buf, &mut output).await;
                let _ = output.flush().await;
                for ack in pending.drain(..) {
                    let _ = ack.send(());
                }
                continue;
            }
        };
        if output.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = output.shutdown().await;
    // Pending flushes are answered only now, with everything written.
    drop(pending);
    drop(requests);
}

/// Keeps what the process wrote before a hang-up: reads the master until it would block.
async fn drain(master: &AsyncFd<OwnedFd>, buf: &mut [u8], output: &mut (dyn AsyncWrite + Send + Unpin)) {
    while let Ok(n @ 1..) = read_fd(master, buf) {
        if output.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn read_fd(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    nix::unistd::read(fd.get_ref().as_raw_fd(), buf).map_err(io::Error::from)
}

/// The pty master as an async stream. A read of EIO means the process side is closed: end of file.
struct Master(Arc<AsyncFd<OwnedFd>>);

impl AsyncRead for Master {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            let mut guard = std::task::ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| read_fd(fd, unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = std::task::ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
