//! `exec`: a process started in a running container, as runc's `exec --detach` starts one.
//!
//! libcontainer 0.7's own exec (its tenant builder) would run the process outside the
//! container's user namespace and without its seccomp filter (see `spec::for_exec`). So the
//! process is assembled here from libcontainer's public parts instead: the spec comes from
//! `spec::for_exec`, and libcontainer's process chain (an intermediate process that joins the
//! cgroup and the user and pid namespaces, then the process itself, which joins the others,
//! drops to the exec's user and capabilities, loads the filter and execs) does the rest.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use libcgroups::common::CgroupConfig;
use libcontainer::container::ContainerStatus;
use libcontainer::notify_socket::{NotifyListener, NotifySocket};
use libcontainer::oci_spec::runtime::Spec;
use libcontainer::process::args::{ContainerArgs, ContainerType};
use libcontainer::process::container_main_process::container_main_process;
use libcontainer::syscall::syscall::SyscallType;

use crate::args::Global;
use crate::ops::{load, open_namespaces_by_fd, Failure};
use crate::spec;

pub fn run(
    global: &Global,
    id: &str,
    process: &Path,
    pid_file: Option<PathBuf>,
    console_socket: Option<PathBuf>,
) -> Result<(), Failure> {
    let container = load(global, id)?;
    if container.status() != ContainerStatus::Running {
        return Err(format!("cannot exec in a {} container {id:?}", container.status()).into());
    }
    let init = container.pid().ok_or("the container's state has no init pid")?;
    let process: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(process).map_err(|e| format!("read {}: {e}", process.display()))?,
    )
    .map_err(|e| format!("{}: not JSON: {e}", process.display()))?;
    if process["terminal"] == true && console_socket.is_none() {
        return Err("process.terminal: a terminal needs --console-socket".into());
    }
    let bundle = container.bundle();
    let mut joined = spec::for_exec(&spec::read(bundle)?, process, init.as_raw())?;
    // Every namespace file but the user namespace's is opened here, as the host's root, and
    // named by fd: the intermediate process joins the user namespace first, and as its root it
    // could no longer open them (the create path does the same, see `ops::userns_bundle`).
    // Kept open until the process has joined them.
    let namespace_files = open_namespaces_by_fd(&mut joined, bundle)?;
    let spec: Spec = serde_json::from_value(joined).map_err(|e| format!("the exec's spec: {e}"))?;
    let rootfs = spec.root().as_ref().map(|r| r.path().clone()).ok_or("the container's spec has no root")?;
    let cgroup_path = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone());
    let oom_score_adj = spec.process().as_ref().and_then(|p| p.oom_score_adj());

    // This exec's own files in the container's state directory, named by this process's pid
    // (unique while it runs) and removed when it returns, whatever the outcome.
    let dir = global.root.join(id);
    let tag = format!("exec-{}", std::process::id());
    let cleanup = RemoveOnDrop(vec![dir.join(format!("{tag}.sock")), dir.join(format!("{tag}.tty"))]);
    // Left by an exec that was killed with the same pid (bind and symlink would fail on them).
    cleanup.remove();
    let console = match &console_socket {
        Some(socket) => Some(
            libcontainer::tty::setup_console_socket(&dir, socket, &format!("{tag}.tty"))
                .map_err(|e| format!("console socket {}: {e}", socket.display()))?,
        ),
        None => None,
    };
    let notify_path = dir.join(format!("{tag}.sock"));
    let notify_listener = NotifyListener::new(&notify_path)?;

    // As for any process joining the container: its oom_score_adj is inherited from here, and
    // nothing in the container may ptrace or read this process's memory while it joins.
    if let Some(adj) = oom_score_adj {
        std::fs::write("/proc/self/oom_score_adj", adj.to_string())
            .map_err(|e| format!("process.oomScoreAdj {adj}: {e}"))?;
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!("prctl(PR_SET_DUMPABLE): {}", std::io::Error::last_os_error()).into());
    }
    // The process reports a failure before its exec on this pipe; the exec (close-on-exec)
    // closes its end, so end of file without a message is success.
    let (report, report_writer) = pipe()?;
    let args = ContainerArgs {
        container_type: ContainerType::TenantContainer { exec_notify_fd: report_writer.as_raw_fd() },
        syscall: SyscallType::Linux,
        spec: Rc::new(spec),
        rootfs,
        console_socket: console.as_ref().map(AsRawFd::as_raw_fd),
        notify_listener,
        preserve_fds: 0,
        // Read only for the state a seccomp listener is sent (as runc's exec sends it).
        container: Some(container.clone()),
        user_ns_config: None,
        cgroup_config: CgroupConfig {
            cgroup_path: libcontainer::utils::get_cgroup_path(&cgroup_path, id),
            systemd_cgroup: container.systemd(),
            container_name: id.to_string(),
        },
        detached: true,
        executor: libcontainer::workload::default::get_executor(),
        no_pivot: false,
        stdin: None,
        stdout: None,
        stderr: None,
        as_sibling: false,
        pid_file,
    };
    container_main_process(&args)?;
    drop(namespace_files);
    NotifySocket::new(&notify_path).notify_container_start()?;
    drop(report_writer);
    drop(args);
    let mut failure = String::new();
    std::fs::File::from(report)
        .read_to_string(&mut failure)
        .map_err(|e| format!("read the exec'd process's report: {e}"))?;
    if !failure.is_empty() {
        return Err(failure.into());
    }
    Ok(())
}

fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array it is given, which this function then owns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe2: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both fds were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

struct RemoveOnDrop(Vec<PathBuf>);

impl RemoveOnDrop {
    fn remove(&self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        self.remove();
    }
}
