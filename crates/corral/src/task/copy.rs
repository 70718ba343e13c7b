//! Output that corral copies itself, and how a process's exit waits for it.
//!
//! A `file://` stream is never handed to the process as the host file: the process would hold
//! the node's log file, so it could ftruncate or fallocate it, or read its path in
//! /proc/self/fd. It gets the write end of a pipe; corral appends what it reads from the pipe to
//! the file ([`to_file`]), as containerd's runc shim does. A terminal's output is pumped the same
//! way (`console.rs`).
//!
//! Both copies answer flush requests ([`Flusher`]) once what the process wrote is in place. For
//! a pipe that is everything it holds at that moment: run after the process has exited, that is
//! all the process wrote (a write to a pipe is in its buffer when the call returns), even while
//! other processes still hold the pipe. A terminal delivers to its master a moment later, so its
//! pump waits for the terminal's end of file, or a short grace (`console.rs`). The exit is
//! published only after the flush.
//!
//! A copy lives until every writer is gone, independently of containerd (the file is corral's
//! own), so a containerd restart loses nothing.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::error::{IoContext, Result};

/// Bytes read from the pipe per write into the file: a whole pipe buffer at Linux's default size.
const CHUNK: usize = 64 * 1024;

/// Asks one copy to write out what its source holds now.
#[derive(Clone)]
pub struct Flusher(mpsc::UnboundedSender<oneshot::Sender<()>>);

/// The copy's side of a [`Flusher`]. Dropping it answers every pending request: the copy must
/// hold it until its last write is flushed.
pub struct FlushRequests(mpsc::UnboundedReceiver<oneshot::Sender<()>>);

pub fn flush_channel() -> (Flusher, FlushRequests) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Flusher(tx), FlushRequests(rx))
}

impl Flusher {
    /// Resolves once the copy has written out what its source held when asked, or has ended
    /// (having written everything).
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.0.send(ack).is_ok() {
            let _ = done.await;
        }
    }
}

impl FlushRequests {
    /// The next request; pending forever once every [`Flusher`] is gone, so it can sit in a
    /// `select!` beside the copy's reads.
    pub async fn next(&mut self) -> oneshot::Sender<()> {
        match self.0.recv().await {
            Some(ack) => ack,
            None => std::future::pending().await,
        }
    }
}

/// Starts copying the read end of a process's output pipe into `file` until every writer is
/// gone; `path` names the file in log lines.
pub fn to_file(pipe: OwnedFd, file: File, path: PathBuf) -> Result<Flusher> {
    let source =
        tokio::net::unix::pipe::Receiver::from_owned_fd(pipe).with_path("read the output pipe of", &path)?;
    let (flusher, requests) = flush_channel();
    tokio::spawn(copy_to_file(source, tokio::fs::File::from_std(file), path, requests));
    Ok(flusher)
}

async fn copy_to_file<W: tokio::io::AsyncWrite + Unpin>(
    mut source: tokio::net::unix::pipe::Receiver,
    mut file: W,
    path: PathBuf,
    mut requests: FlushRequests,
) {
    let mut buf = vec![0u8; CHUNK];
    // A failing file (a full disk) must not kill the process with SIGPIPE: keep reading, keep
    // trying, and say so once.
    let mut failed = false;
    let mut write = async |file: &mut W, data: &[u8]| {
        if let Err(e) = file.write_all(data).await {
            if !std::mem::replace(&mut failed, true) {
                tracing::warn!(file = %path.display(), error = %e, "output file write failed; output is lost");
            }
        }
    };
    loop {
        tokio::select! {
            read = source.read(&mut buf) => match read {
                Ok(n @ 1..) => write(&mut file, &buf[..n]).await,
                // End of file: every writer is gone.
                _ => break,
            },
            ack = requests.next() => {
                // What the pipe holds now, and no more: that is all the exited process wrote,
                // and a writer that lives on (a child holding the pipe) must not keep the exit
                // waiting by keeping the pipe full.
                let mut pending = bytes_in_pipe(&source);
                while pending > 0 {
                    let want = pending.min(buf.len());
                    match source.try_read(&mut buf[..want]) {
                        Ok(n @ 1..) => {
                            write(&mut file, &buf[..n]).await;
                            pending -= n;
                        }
                        _ => break,
                    }
                }
                // tokio's File completes writes in the background: flush waits for them.
                let _ = file.flush().await;
                let _ = ack.send(());
            }
        }
    }
    let _ = file.flush().await;
    drop(requests);
}

/// The bytes waiting in a pipe (FIONREAD); 0 if the kernel does not say.
fn bytes_in_pipe(pipe: &impl std::os::fd::AsRawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at `n`.
    let rc = unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    if rc == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::io::Write;
    use std::time::Duration;

    use super::*;

    fn pipe() -> (OwnedFd, File) {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        (read, File::from(write))
    }

    #[tokio::test]
    async fn a_flush_writes_out_what_the_pipe_holds_while_a_writer_stays() {
        let dir = std::env::temp_dir().join(format!("corral-copy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.log");
        let _ = std::fs::remove_file(&path);
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let (read, mut writer) = pipe();
        let flusher = to_file(read, file, path.clone()).unwrap();
        // More than a pipe buffer, written from a thread as a process would (it blocks while
        // the copy catches up).
        let data: Vec<u8> = (0..300 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
        let expected = data.clone();
        let thread = std::thread::spawn(move || {
            writer.write_all(&data).unwrap();
            writer
        });
        while !thread.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let writer = thread.join().unwrap();
        // The writer is still open (another process holding the pipe): no end of file, yet a
        // flush puts everything already written in the file.
        tokio::time::timeout(Duration::from_secs(5), flusher.flush()).await.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), expected);
        drop(writer);
        // After the end of file the copy is gone and a flush returns at once.
        tokio::time::timeout(Duration::from_secs(5), async {
            while !flusher.0.is_closed() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(1), flusher.flush()).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An output file slower than the pipe's writer: each write takes 2 ms.
    struct SlowFile(Option<std::pin::Pin<Box<tokio::time::Sleep>>>);

    impl tokio::io::AsyncWrite for SlowFile {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let sleep = self.0.get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(2))));
            std::task::ready!(sleep.as_mut().poll(cx));
            self.0 = None;
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// A child of the exited process keeps the pipe full while the file is slower than it: the
    /// flush writes out what the pipe held when asked and answers, instead of chasing the writer
    /// for as long as it writes (the bound only keeps a broken build from hanging; it is no
    /// timing claim: the writer never stops before the flush answers or the bound passes).
    #[tokio::test]
    async fn a_flush_ends_while_another_writer_keeps_the_pipe_full() {
        let (read, mut writer) = pipe();
        let source = tokio::net::unix::pipe::Receiver::from_owned_fd(read).unwrap();
        let (flusher, requests) = flush_channel();
        tokio::spawn(copy_to_file(source, SlowFile(None), PathBuf::from("slow"), requests));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let chatter = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let chunk = vec![b'x'; 64 * 1024];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if writer.write_all(&chunk).is_err() {
                        break;
                    }
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let answered = tokio::time::timeout(Duration::from_secs(10), flusher.flush()).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Off this thread: the writer may sit in a write until the copy (on this thread) drains.
        tokio::task::spawn_blocking(move || chatter.join()).await.unwrap().unwrap();
        assert!(answered.is_ok(), "the flush chased a writer that never stopped");
    }
}
