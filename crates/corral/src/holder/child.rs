//! The code that runs as the holder process. It runs single-threaded, before any async runtime,
//! so `fork` here is safe; it allocates little and then only waits for signals.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;

use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, getpid, sethostname, ForkResult};

use super::{HolderSpec, Report};
use crate::pod::sysctl;

/// containerd's oom_score_adj for the pause container.
pub const OOM_SCORE_ADJ: i32 = -998;

/// Entry point for `containerd-shim-corral-v2 holder <sandbox id>`. Never returns.
pub fn main() -> ! {
    let mut input = String::new();
    let spec: HolderSpec = match std::io::stdin().read_to_string(&mut input) {
        Ok(_) => match serde_json::from_str(&input) {
            Ok(spec) => spec,
            Err(e) => fail("decode spec", e.to_string()),
        },
        Err(e) => fail("read spec", e.to_string()),
    };
    // Block the signals we wait for before anything can send them.
    let signals = waited_signals();
    if let Err(e) = signals.thread_block() {
        fail("block signals", e.to_string());
    }
    if let Err((step, e)) = enter_pod(&spec) {
        fail(&step, e);
    }
    if spec.new_pid {
        // SAFETY: the holder is single-threaded (no runtime was started), so the child may run
        // arbitrary code after fork.
        match unsafe { fork() } {
            Ok(ForkResult::Parent { child }) => {
                report(&Report::Ready {
                    pid: child.as_raw(),
                });
                std::process::exit(0);
            }
            Ok(ForkResult::Child) => {
                detach_stdio();
                wait_forever(&signals);
            }
            Err(e) => fail("fork pid 1 of the pod", e.to_string()),
        }
    }
    report(&Report::Ready {
        pid: getpid().as_raw(),
    });
    detach_stdio();
    wait_forever(&signals)
}

/// Joins and creates the pod's namespaces, sets hostname and sysctls. Errors name the step.
fn enter_pod(spec: &HolderSpec) -> Result<(), (String, String)> {
    // Like the pause container: the last process the OOM killer should pick. Root without
    // CAP_SYS_RESOURCE cannot lower it; the pod does not depend on it.
    let _ = std::fs::write("/proc/self/oom_score_adj", OOM_SCORE_ADJ.to_string());
    if let Some(netns) = &spec.netns {
        let step = || format!("join network namespace {}", netns.display());
        let file = File::open(netns).map_err(|e| (step(), e.to_string()))?;
        if spec.join_netns_owner {
            // The user namespace first: the netns, and the namespaces created below, are then
            // owned by it.
            let owner = crate::sys::ns::owner_user_ns(&file).map_err(|e| {
                (
                    format!("find the user namespace owning {}", netns.display()),
                    e.to_string(),
                )
            })?;
            setns(owner.as_fd(), CloneFlags::CLONE_NEWUSER)
                .map_err(|e| ("join the pod's user namespace".to_string(), e.to_string()))?;
        }
        setns(file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
            let why = if e == nix::errno::Errno::EINVAL {
                " (not a network namespace)"
            } else {
                ""
            };
            (step(), format!("{e}{why}"))
        })?;
    }
    let mut flags = CloneFlags::empty();
    if spec.new_ipc {
        flags |= CloneFlags::CLONE_NEWIPC;
    }
    if spec.new_uts {
        flags |= CloneFlags::CLONE_NEWUTS;
    }
    if spec.new_pid {
        flags |= CloneFlags::CLONE_NEWPID;
    }
    if !flags.is_empty() {
        unshare(flags).map_err(|e| ("create pod namespaces".to_string(), e.to_string()))?;
    }
    if let (true, Some(name)) = (spec.new_uts, &spec.hostname) {
        sethostname(name).map_err(|e| (format!("set hostname {name:?}"), e.to_string()))?;
    }
    // /proc/sys/net and the IPC keys resolve against the writer's namespaces: ours now.
    for (key, value) in &spec.sysctls {
        let path = sysctl::proc_path(key);
        std::fs::write(&path, value.as_bytes())
            .map_err(|e| (format!("set sysctl {key}={value:?}"), e.to_string()))?;
    }
    Ok(())
}

fn waited_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    set
}

/// Waits for signals: reaps children on SIGCHLD (as pid 1 of the pod it inherits orphans), exits on
/// SIGTERM/SIGINT/SIGHUP. As pid 1 of a PID namespace, the kernel drops those signals when they
/// come from inside the pod, so only the node can stop it.
fn wait_forever(signals: &SigSet) -> ! {
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => loop {
                match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => continue,
                }
            },
            Ok(_) => std::process::exit(0),
            Err(_) => continue,
        }
    }
}

fn report(report: &Report) {
    let mut line = serde_json::to_string(report).expect("Report serializes");
    line.push('\n');
    let _ = std::io::stdout().write_all(line.as_bytes());
    let _ = std::io::stdout().flush();
}

fn fail(step: &str, error: String) -> ! {
    report(&Report::Failed {
        step: step.to_string(),
        error,
    });
    std::process::exit(1)
}

/// Points stdio at /dev/null so the parent's pipes see EOF and nothing is held open.
fn detach_stdio() {
    if let Ok(null) = File::options().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            let _ = nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd);
        }
    }
}
