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

async fn copy_to_file(
    mut source: tokio::net::unix::pipe::Receiver,
    mut file: tokio::fs::File,
    path: PathBuf,
    mut requests: FlushRequests,
) {
    let mut buf = vec![0u8; CHUNK];
    // A failing file (a full disk) must not kill the process with SIGPIPE: keep reading, keep
    // trying, and say so once.
    let mut failed = false;
    let mut write = async |file: &mut tokio::fs::File, data: &[u8]| {
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
                while let Ok(n @ 1..) = source.try_read(&mut buf) {
                    write(&mut file, &buf[..n]).await;
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

#[cfg(test)]
mod tests {
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
}
