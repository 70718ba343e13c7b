//! corral's builtin OCI runtime (`corral-oci`, selected by `CORRAL_RUNC=builtin` in the shims'
//! environment) through CRI, whatever runtime the rest of this run uses: containers run with no
//! runc process, their state is libcontainer's under /run/corral/oci, and a container whose
//! setup fails names the cause and leaves nothing (processes, mounts, cgroup, state).
//! The whole suite also runs with the builtin runtime (scripts/test.sh); this file holds what
//! is specific to it (its user namespace case is in `user_namespace`: it needs a 6.3+ kernel).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, log_dir, pod_config, wait_for_text};
use corral_rig::{cgroup, probe, scaled, Options, Rig};
use k8s_cri::v1::{security_profile::ProfileType, Mount, SecurityProfile};

const HANDLER: &str = "corral";
const STATE: &str = "/run/corral/oci/k8s.io";

fn options() -> Options {
    Options {
        shim_env: vec!["CORRAL_RUNC=builtin".into()],
        env_remove: vec!["CORRAL_RUNC".into()],
        ..Default::default()
    }
}

fn parent_pid(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()
        .and_then(|s| s.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// The container's cgroup directory holding its memory controller, from its init's /proc.
fn memory_cgroup_of(pid: u32) -> Result<PathBuf> {
    Ok(cgroup::dir("memory", &cgroup::of_pid(pid)?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_run_without_runc_and_leave_nothing() -> Result<()> {
    let rig = Rig::start(options()).await?;
    let mut cri = rig.cri().await?;
    let logs = log_dir(&rig.dir, "builtin");
    // Under systemd a slice parent, so the containers take systemd's driver (on the VM); the
    // failure test below keeps no parent: cgroupfs on either cgroup version.
    let pod_cfg = rig.pod_config("builtin");
    let pod = cri.run_pod(&pod_cfg, HANDLER).await?;
    let holder = probe::holder_of(&pod).context("the pod's holder")?;
    // pid 1 of its pid namespace: it ends on SIGTERM only through its handler.
    let script = "trap 'exit 7' TERM; echo hello-builtin; sleep 1000 & wait";
    let mut config = container_config("app", script);
    let security =
        config.linux.as_mut().and_then(|l| l.security_context.as_mut()).context("security context")?;
    security.seccomp =
        Some(SecurityProfile { profile_type: ProfileType::RuntimeDefault as i32, ..Default::default() });
    // What kubelet sends for procMount: Default (CRI adds none of its own).
    security.masked_paths = vec!["/proc/timer_list".into(), "/proc/keys".into(), "/proc/acpi".into()];
    security.readonly_paths = vec!["/proc/sys".into(), "/proc/bus".into()];
    let c = cri.run_container(&pod, &pod_cfg, &config).await?;
    wait_for_text(&logs.join("app.log"), "hello-builtin", scaled(Duration::from_secs(20))).await?;

    let state = Path::new(STATE).join(&c);
    assert!(state.join("state.json").is_file(), "libcontainer's state for {c} under {STATE}");
    assert!(!Path::new("/run/corral/runc/k8s.io").join(&c).exists(), "runc knows nothing of {c}");
    // corral sent the start itself (no corral-oci process), then removed the init's socket.
    assert!(!state.join("notify.sock").exists(), "StartContainer used {c}'s notify.sock and removed it");
    let pid = cri.container_pid(&c).await?;
    // The helper is gone once the container is created: the init was reparented to corral's
    // server (a subreaper), which watches its exit.
    let server = if corral_rig::node_mode() { probe::node_server_of(&pod) } else { probe::shim_of(&pod) };
    assert_eq!(Some(parent_pid(pid)), server, "the container's init is a child of corral's server");
    for kind in ["net", "ipc", "uts"] {
        assert_eq!(probe::ns(pid, kind)?, probe::ns(holder, kind)?, "{kind}: the container joins the pod");
    }
    // The confinement a runc container has: containerd's default seccomp profile (filter mode),
    // CRI's capability set (not all of root's), masked and read-only /proc paths.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or("").to_string()
    };
    assert_eq!(field("Seccomp:"), "2", "seccomp filter applied");
    let bounding = u64::from_str_radix(&field("CapBnd:"), 16)?;
    assert_eq!(bounding & (1 << 21), 0, "no CAP_SYS_ADMIN in the bounding set: {bounding:#x}");
    assert_ne!(bounding & (1 << 27), 0, "CAP_MKNOD, one of CRI's defaults, is kept: {bounding:#x}");
    let files_in = |dir: &Path| -> Result<BTreeSet<_>> {
        Ok(std::fs::read_dir(dir)?.flatten().map(|e| e.file_name()).collect())
    };
    let state_before_execs = files_in(&state)?;
    let (code, out, err) = cri.exec_sync(&c, &["stat", "-c", "%t:%T", "/proc/timer_list"]).await?;
    assert_eq!((code, out.trim()), (0, "1:3"), "/proc/timer_list is masked with /dev/null: {err}");
    let (code, _, err) = cri.exec_sync(&c, &["sh", "-c", "echo 1 > /proc/sys/kernel/domainname"]).await?;
    assert!(code != 0 && err.contains("Read-only file system"), "/proc/sys is read-only: {code} {err}");
    // An exec'd process gets the container's filter too, as runc gives it (libcontainer 0.7's
    // own exec would drop it; corral-oci assembles exec itself).
    let (code, out, err) = cri.exec_sync(&c, &["grep", "^Seccomp:", "/proc/self/status"]).await?;
    assert_eq!((code, out.split_whitespace().collect::<Vec<_>>()), (0, vec!["Seccomp:", "2"]), "{err}");
    let (code, out, _) = cri.exec_sync(&c, &["cat", "/proc/1/cmdline"]).await?;
    assert_eq!(code, 0);
    assert!(
        out.starts_with("/bin/sh\u{0}-c\u{0}trap"),
        "exec runs in the container's pid namespace: {out:?}"
    );
    // The device rules hold (v1 devices cgroup; v2 a BPF program, which under systemd's driver
    // corral-oci attaches itself): the container has CAP_MKNOD, but not the right to make or
    // use a block device.
    let (code, _, err) =
        cri.exec_sync(&c, &["sh", "-c", "mknod /tmp/loop0 b 7 0 && head -c 1 /tmp/loop0"]).await?;
    assert!(code != 0 && err.contains("Operation not permitted"), "device rules: exit {code}: {err}");
    for _ in 0..3 {
        assert_eq!(cri.exec_sync(&c, &["true"]).await?.0, 0);
    }
    assert_eq!(
        files_in(&state)?,
        state_before_execs,
        "each exec's files (start socket, tty link) are removed"
    );
    let memory = memory_cgroup_of(pid)?;
    assert!(memory.is_dir(), "{}", memory.display());

    cri.stop_container(&c).await?;
    let status = cri.container_status(&c).await?;
    let exit = status.status.context("status")?.exit_code;
    assert_eq!(exit, 7, "StopContainer's SIGTERM reached the init's handler, its exit status reached CRI");
    cri.stop_and_remove_pod(&pod).await?;
    assert!(!state.exists(), "state of {c} removed");
    assert!(probe::pids_in_cgroup_of(&c).is_empty(), "no process of {c} left");
    assert!(!memory.exists(), "cgroup {} removed", memory.display());
    assert!(probe::mounts_containing(&c).is_empty(), "no mount of {c} left");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_whose_setup_fails_names_the_cause_and_leaves_nothing() -> Result<()> {
    let rig = Rig::start(options()).await?;
    let mut cri = rig.cri().await?;
    let logs = log_dir(&rig.dir, "broken");
    let pod_cfg = pod_config("broken", &logs);
    let pod = cri.run_pod(&pod_cfg, HANDLER).await?;

    let mut missing = container_config("missing", "true");
    missing.command = vec!["/no/such/binary".into()];
    let mut bad_cwd = container_config("badcwd", "true");
    bad_cwd.working_dir = "/etc/passwd".into();
    // A file mounted over a directory of the image: the bind fails in the container's init.
    let mut bad_mount = container_config("badmount", "true");
    bad_mount.mounts = vec![Mount {
        host_path: "/etc/hostname".into(),
        container_path: "/bin".into(),
        ..Default::default()
    }];
    let cases = [(missing, "/no/such/binary"), (bad_cwd, "/etc/passwd"), (bad_mount, "/etc/hostname")];
    for (config, cause) in cases {
        let name = config.metadata.as_ref().unwrap().name.clone();
        let id = cri.create_container(&pod, &pod_cfg, &config).await;
        // Whether CreateContainer or StartContainer reports it, the error names the cause.
        let (id, err) = match id {
            Err(e) => (None, e.to_string()),
            Ok(id) => match cri.start_container(&id).await {
                Err(e) => (Some(id), e.to_string()),
                Ok(()) => anyhow::bail!("{name}: the container started"),
            },
        };
        assert!(err.contains(cause), "{name}: the error names {cause}: {err}");
        if let Some(id) = id {
            assert!(probe::pids_in_cgroup_of(&id).is_empty(), "{name}: no process left");
            assert!(!Path::new(STATE).join(&id).exists(), "{name}: no state left");
            cri.remove_container(&id).await?;
            assert!(probe::mounts_containing(&id).is_empty(), "{name}: no mount left");
        }
    }
    // The pod is untouched and still runs containers.
    assert!(cri.pod_ready(&pod).await?);
    let c = cri.run_container(&pod, &pod_cfg, &container_config("fine", "exec sleep 1000")).await?;
    assert!(cri.container_pid(&c).await? > 0);
    cri.stop_and_remove_pod(&pod).await?;
    assert!(!Path::new(STATE).join(&c).exists(), "no state left of {c}");
    Ok(())
}
