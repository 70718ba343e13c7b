//! A client for CRI's streaming server (Exec and Attach URLs), speaking what kubectl speaks to it
//! over WebSocket: the `v4.channel.k8s.io` protocol, where each binary message starts with its
//! channel (0 stdin, 1 stdout, 2 stderr, 3 status, 4 terminal size).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// An open Exec or Attach session.
pub struct Session {
    ws: Socket,
    /// Everything read from stdout (a terminal's only output) so far.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The final status (channel 3), once sent.
    pub status: Option<serde_json::Value>,
}

impl Session {
    /// Connects to the URL CRI's Exec or Attach returned.
    pub async fn connect(url: &str) -> Result<Session> {
        let ws_url = url.replacen("http://", "ws://", 1);
        let mut request = ws_url.as_str().into_client_request()?;
        request.headers_mut().insert("Sec-WebSocket-Protocol", "v4.channel.k8s.io".parse()?);
        let (ws, _) =
            tokio_tungstenite::connect_async(request).await.with_context(|| format!("connect {url}"))?;
        Ok(Session { ws, stdout: Vec::new(), stderr: Vec::new(), status: None })
    }

    async fn send(&mut self, channel: u8, data: &[u8]) -> Result<()> {
        let mut message = vec![channel];
        message.extend_from_slice(data);
        self.ws.send(Message::Binary(message.into())).await.context("send to the stream")
    }

    pub async fn stdin(&mut self, data: &[u8]) -> Result<()> {
        self.send(0, data).await
    }

    /// Sets the terminal size, as kubectl does when the window changes.
    pub async fn resize(&mut self, width: u16, height: u16) -> Result<()> {
        self.send(4, serde_json::json!({"Width": width, "Height": height}).to_string().as_bytes()).await
    }

    /// Reads one message; false at the end of the session.
    async fn read_one(&mut self, deadline: Instant) -> Result<bool> {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = match tokio::time::timeout(left, self.ws.next()).await {
            Err(_) => bail!("no message in time; stdout so far: {:?}", String::from_utf8_lossy(&self.stdout)),
            Ok(None) => return Ok(false),
            Ok(Some(m)) => m?,
        };
        match message {
            Message::Binary(data) if !data.is_empty() => match data[0] {
                1 => self.stdout.extend_from_slice(&data[1..]),
                2 => self.stderr.extend_from_slice(&data[1..]),
                3 if data.len() > 1 => self.status = Some(serde_json::from_slice(&data[1..])?),
                _ => {}
            },
            Message::Close(_) => return Ok(false),
            _ => {}
        }
        Ok(true)
    }

    /// Reads until stdout contains `needle`; returns stdout so far.
    pub async fn read_until(&mut self, needle: &str, timeout: Duration) -> Result<String> {
        let timeout = crate::scaled(timeout);
        let deadline = Instant::now() + timeout;
        while !String::from_utf8_lossy(&self.stdout).contains(needle) {
            if !self.read_one(deadline).await? {
                bail!(
                    "the session ended before {needle:?}; stdout: {:?}",
                    String::from_utf8_lossy(&self.stdout)
                );
            }
        }
        Ok(String::from_utf8_lossy(&self.stdout).into_owned())
    }

    /// Reads to the end of the session; returns the process's exit code from the final status.
    pub async fn finish(&mut self, timeout: Duration) -> Result<i32> {
        let deadline = Instant::now() + timeout;
        while self.read_one(deadline).await? {}
        let status = self.status.as_ref().ok_or_else(|| anyhow!("the session ended with no status"))?;
        exit_code(status)
    }
}

/// The exit code in a v4 status: Success is 0; a non-zero exit is a Failure whose ExitCode cause
/// carries the code.
pub fn exit_code(status: &serde_json::Value) -> Result<i32> {
    if status["status"] == "Success" {
        return Ok(0);
    }
    let causes = status["details"]["causes"].as_array().ok_or_else(|| anyhow!("status {status}"))?;
    let code = causes
        .iter()
        .find(|c| c["reason"] == "ExitCode")
        .and_then(|c| c["message"].as_str())
        .ok_or_else(|| anyhow!("no exit code in status {status}"))?;
    Ok(code.parse()?)
}
