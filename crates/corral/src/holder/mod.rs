//! The holder: a tiny process (this same binary, run as `holder <sandbox id>`) that sits in the
//! pod's namespaces for as long as the pod lives. CRI builds every container's namespace paths as
//! `/proc/<pid>/ns/*` from the pid corral reports, so that pid must be a process in exactly the
//! pod's namespaces: the holder's. No image, no runc, no container.
//!
//! Parent and child talk in typed JSON messages over the child's stdin and stdout: the parent
//! sends a [`HolderSpec`]; the child answers one [`Report`], naming the step that failed if one
//! did.

pub mod child;
pub mod pins;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::sys::pidfd::PidFd;

/// The argv[1] that turns the shim binary into a holder.
pub const HOLDER_ARG: &str = "holder";

/// What the holder must set up.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HolderSpec {
    pub sandbox_id: String,
    /// Join this network namespace (CRI's); `None` keeps the node's.
    pub netns: Option<PathBuf>,
    /// First join the user namespace that owns `netns` (user namespace mode POD).
    #[serde(default)]
    pub join_netns_owner: bool,
    pub new_ipc: bool,
    pub new_uts: bool,
    /// Create a PID namespace; the reported pid is then pid 1 of it, which reaps the pod's orphans.
    pub new_pid: bool,
    pub hostname: Option<String>,
    pub sysctls: Vec<(String, String)>,
}

/// The holder's one answer.
#[derive(Debug, Serialize, Deserialize)]
pub enum Report {
    /// `pid` (host view) is in all of the pod's namespaces.
    Ready {
        pid: i32,
    },
    Failed {
        step: String,
        error: String,
    },
}

/// A running holder.
pub struct Holder {
    pub pid: i32,
    pub pidfd: PidFd,
}

impl Holder {
    /// Starts a holder and waits for its report. Blocking: call from a blocking context.
    pub fn spawn(spec: &HolderSpec) -> Result<Holder> {
        let exe = PathBuf::from("/proc/self/exe");
        let mut child = Command::new(&exe)
            .arg0(crate::shim::BINARY_NAME)
            .arg(HOLDER_ARG)
            .arg(&spec.sandbox_id)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_path("spawn holder", &exe)?;

        let message = serde_json::to_vec(spec).expect("HolderSpec serializes");
        let sent = child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(&message)
            .context(|| "send spec to holder".into());

        let mut line = String::new();
        let read = BufReader::new(child.stdout.take().expect("stdout is piped"))
            .read_line(&mut line)
            .context(|| "read holder report".into());

        let report = match (sent, read) {
            (Ok(()), Ok(_)) => {
                serde_json::from_str::<Report>(line.trim()).map_err(|e| Error::Holder {
                    step: "report".into(),
                    message: format!("unreadable report {line:?}: {e}"),
                })
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        match report {
            Ok(Report::Ready { pid }) => {
                // With a PID namespace the reporting process is an intermediate that exits now;
                // its child (pid 1 of the pod) is reparented to corral, a subreaper.
                if pid as u32 != child.id() {
                    let _ = child.wait();
                }
                let pidfd = PidFd::open(pid).context(|| format!("pidfd_open holder {pid}"))?;
                Ok(Holder { pid, pidfd })
            }
            Ok(Report::Failed { step, error }) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(Error::Holder {
                    step,
                    message: error,
                })
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }
}
