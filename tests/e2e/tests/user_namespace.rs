//! User namespace mode POD: CRI makes the pod's netns inside a new user namespace; the holder
//! joins that user namespace first, so the pod's IPC and UTS namespaces are owned by it. A
//! container of such a pod (`hostUsers: false`) gets an idmapped rootfs and idmapped pod files:
//! root inside owns and can write them, and nothing on the host is chowned.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use corral_rig::cri::{container_config, container_ns, pod_ns};
use corral_rig::{probe, Options, Rig};
use k8s_cri::v1::security_profile::ProfileType;
use k8s_cri::v1::{IdMapping, Mount, MountPropagation, NamespaceMode, SecurityProfile, UserNamespace};

/// The inode of the user namespace that owns namespace file `path` (ioctl NS_GET_USERNS).
fn owner_inode(path: &str) -> Result<u64> {
    let file = std::fs::File::open(path)?;
    // SAFETY: NS_GET_USERNS (_IO(0xb7, 1)) takes no argument and returns a new fd or -1.
    let fd = unsafe { libc::ioctl(file.as_raw_fd(), 0xb701 as _) };
    anyhow::ensure!(fd >= 0, "NS_GET_USERNS on {path}: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh fd from the ioctl, owned here.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(std::fs::File::from(owned).metadata()?.ino())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_user_namespace_owns_the_pod_namespaces() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("userns");
    let map = || vec![IdMapping { host_id: 200_000, container_id: 0, length: 65_536 }];
    pod_ns(&mut cfg).userns_options =
        Some(UserNamespace { mode: NamespaceMode::Pod as i32, uids: map(), gids: map() });
    let pod = cri.run_pod(&cfg, "corral").await?;
    let holder = probe::holder_of(&pod).context("holder")?;

    let user = std::fs::metadata(format!("/proc/{holder}/ns/user"))?.ino();
    assert_ne!(user, std::fs::metadata("/proc/self/ns/user")?.ino(), "not the node's user namespace");
    let uid_map = std::fs::read_to_string(format!("/proc/{holder}/uid_map"))?;
    assert_eq!(uid_map.split_whitespace().collect::<Vec<_>>(), ["0", "200000", "65536"], "CRI's mapping");
    for kind in ["net", "ipc", "uts"] {
        assert_eq!(
            owner_inode(&format!("/proc/{holder}/ns/{kind}"))?,
            user,
            "{kind} is owned by the pod's user namespace"
        );
    }
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}

/// Where corral attaches idmapped copies of bind sources until `runc create` has used them.
const COPIES_DIR: &str = "/run/corral/idmap";

/// kubelet's shape of mapping: 65536 ids from a multiple of 65536.
const HOST_ID: u32 = 196_608;

/// Fails if a mount of `ids` (containers) or an idmapped copy is left. The copies directory is
/// shared by the file's tests, which run in parallel: another test's container holds copies for
/// the few milliseconds of its create. A leaked copy stays, so the copies get a few seconds to go.
async fn assert_no_mounts_left(ids: &[&str]) -> Result<()> {
    let left: Vec<_> = ids.iter().flat_map(|id| probe::mounts_containing(id)).collect();
    assert!(left.is_empty(), "mounts left: {left:?}");
    corral_rig::eventually(Duration::from_secs(5), || {
        let left = probe::mounts_containing(COPIES_DIR);
        (!left.is_empty()).then(|| format!("idmapped copies left: {left:?}"))
    })
    .await
}

fn userns_pod() -> UserNamespace {
    let map = || vec![IdMapping { host_id: HOST_ID, container_id: 0, length: 65_536 }];
    UserNamespace { mode: NamespaceMode::Pod as i32, uids: map(), gids: map() }
}

/// Owner (uid:gid) of every file below `dir`, without following symlinks.
fn owners(dir: &Path, into: &mut BTreeMap<PathBuf, (u32, u32)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = std::fs::symlink_metadata(entry.path())?;
        into.insert(entry.path(), (meta.uid(), meta.gid()));
        if meta.is_dir() {
            owners(&entry.path(), into)?;
        }
    }
    Ok(())
}

/// The overlay option `key=` of the mount on `target`, from our mountinfo.
fn overlay_option(target: &str, key: &str) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let line = info.lines().find(|l| l.split(' ').nth(4) == Some(target))?;
    let super_opts = line.rsplit(' ').next()?;
    super_opts.split(',').find_map(|o| o.strip_prefix(&format!("{key}=")).map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_in_a_user_namespace_pod_owns_its_idmapped_rootfs() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("userns-ctr");
    pod_ns(&mut cfg).userns_options = Some(userns_pod());
    let pod = cri.run_pod(&cfg, "corral").await?;

    // The image's layers as they are on the host before any container of the pod exists.
    let snapshots = rig.root.join("io.containerd.snapshotter.v1.overlayfs/snapshots");
    let mut before = BTreeMap::new();
    owners(&snapshots, &mut before).with_context(|| format!("walk {}", snapshots.display()))?;
    anyhow::ensure!(
        before.keys().any(|p| p.ends_with("fs/bin/busybox")),
        "busybox's layer not found under {}",
        snapshots.display()
    );

    let mut ctr = container_config("app", "exec sleep 1000");
    container_ns(&mut ctr).userns_options = Some(userns_pod());
    let id = cri.run_container(&pod, &cfg, &ctr).await.context("run a container in a hostUsers:false pod")?;
    let sh = |script: &str| ["sh".to_string(), "-c".to_string(), script.to_string()];
    let mut run = async |script: &str| -> Result<String> {
        let cmd = sh(script);
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let (code, out, err) = cri.exec_sync(&id, &cmd).await?;
        anyhow::ensure!(code == 0, "{script:?} exited {code}: {err}");
        Ok(out.trim().to_string())
    };

    let uid_map = run("cat /proc/self/uid_map").await?;
    assert_eq!(uid_map.split_whitespace().collect::<Vec<_>>(), ["0", "196608", "65536"], "CRI's mapping");
    let gid_map = run("cat /proc/self/gid_map").await?;
    assert_eq!(gid_map.split_whitespace().collect::<Vec<_>>(), ["0", "196608", "65536"]);
    assert_eq!(run("stat -c %u:%g /").await?, "0:0", "/ is root's");
    assert_eq!(run("stat -c %u:%g /bin/busybox /etc").await?, "0:0\n0:0", "image files are root's");
    run("touch /newfile && echo hi > /etc/written").await.context("root writes its rootfs")?;
    assert_eq!(run("stat -c %u:%g /newfile /etc/written").await?, "0:0\n0:0");
    for path in ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/dev/shm"] {
        assert_eq!(run(&format!("stat -c %u:%g {path}")).await?, "0:0", "{path} is root's inside");
    }
    run("echo note > /dev/shm/note && echo 127.0.0.2 extra >> /etc/hosts")
        .await
        .context("root writes the pod files")?;

    // On the host: the new file is the mapped root's in the container's upper dir (the kernel
    // mapped it, nothing was chowned), and the image's layers are exactly as before.
    let rootfs = rig.state.join(format!("io.containerd.runtime.v2.task/k8s.io/{id}/rootfs"));
    let upper = overlay_option(&rootfs.display().to_string(), "upperdir")
        .with_context(|| format!("no overlay upperdir on {}", rootfs.display()))?;
    let new = std::fs::metadata(Path::new(&upper).join("newfile"))?;
    assert_eq!((new.uid(), new.gid()), (HOST_ID, HOST_ID), "written as the mapped root");
    let mut after = BTreeMap::new();
    owners(&snapshots, &mut after)?;
    let upper_dir = Path::new(&upper).parent().context("upper has a parent")?.to_path_buf();
    let changed: Vec<_> = before.iter().filter(|(p, o)| after.get(*p) != Some(*o)).collect();
    assert!(changed.is_empty(), "image snapshot files changed owner: {changed:?}");
    let layers_after: BTreeMap<_, _> =
        after.into_iter().filter(|(p, _)| !p.starts_with(&upper_dir)).collect();
    assert_eq!(layers_after, before, "the image's layers are untouched");
    let shim = probe::shim_of(&pod).context("shim")?;
    let copies: Vec<_> = std::fs::read_dir(COPIES_DIR)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(
        !copies.iter().any(|n| n.starts_with(&format!("{shim}-"))),
        "idmapped copies of the pod files are detached once the container is created: {copies:?}"
    );

    cri.stop_container(&id).await?;
    cri.remove_container(&id).await?;
    let left = probe::mounts_containing(&id);
    assert!(left.is_empty(), "mounts left after RemoveContainer: {left:?}");
    cri.stop_and_remove_pod(&pod).await?;
    assert_no_mounts_left(&[]).await?;
    Ok(())
}

/// A hostPath volume of a hostUsers:false pod, with the mappings kubelet sends for it: inside,
/// root sees the volume's files as the host's owners see them and writes files the host's root
/// owns, nothing chowned. containerd 2.1 first asks the shim's `-info` whether it does idmapped
/// mounts, and refuses the container otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_mapped_volume_keeps_the_host_owners_inside_the_pod() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("userns-vol");
    pod_ns(&mut cfg).userns_options = Some(userns_pod());
    let pod = cri.run_pod(&cfg, "corral").await?;
    let source = rig.dir.join("volume");
    std::fs::create_dir_all(&source)?;
    std::fs::write(source.join("from-host"), "x")?;
    std::os::unix::fs::chown(source.join("from-host"), Some(1000), Some(1000))?;
    let mut ctr = container_config("app", "exec sleep 1000");
    container_ns(&mut ctr).userns_options = Some(userns_pod());
    let map = || vec![IdMapping { host_id: HOST_ID, container_id: 0, length: 65_536 }];
    ctr.mounts = vec![Mount {
        container_path: "/vol".into(),
        host_path: source.display().to_string(),
        propagation: MountPropagation::PropagationPrivate as i32,
        uid_mappings: map(),
        gid_mappings: map(),
        ..Default::default()
    }];
    let id = cri.run_container(&pod, &cfg, &ctr).await.context("a container with an id-mapped volume")?;
    let (code, out, err) = cri.exec_sync(&id, &["stat", "-c", "%u:%g", "/vol/from-host", "/vol"]).await?;
    assert_eq!((code, out.as_str()), (0, "1000:1000\n0:0\n"), "{err}");
    let (code, _, err) = cri.exec_sync(&id, &["touch", "/vol/from-pod"]).await?;
    assert_eq!(code, 0, "root writes the volume: {err}");
    let written = std::fs::metadata(source.join("from-pod"))?;
    assert_eq!((written.uid(), written.gid()), (0, 0), "the pod's root is the host's root on the volume");
    let host = std::fs::metadata(source.join("from-host"))?;
    assert_eq!((host.uid(), host.gid()), (1000, 1000), "nothing chowned");

    cri.stop_container(&id).await?;
    cri.remove_container(&id).await?;
    cri.stop_and_remove_pod(&pod).await?;
    assert_no_mounts_left(&[&id]).await?;
    Ok(())
}

/// corral's builtin OCI runtime (corral-oci): a container of a hostUsers:false pod runs in the
/// pod's user namespace, and so does a process exec'd into it (libcontainer 0.7's own exec
/// would run it outside, as the host's root: corral-oci assembles exec itself), with the
/// container's seccomp filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_runtime_runs_and_execs_in_the_pods_user_namespace() -> Result<()> {
    // The builtin runtime whatever runtime this run's other tests use.
    let options = Options {
        shim_env: vec!["CORRAL_RUNC=builtin".into()],
        env_remove: vec!["CORRAL_RUNC".into()],
        ..Default::default()
    };
    let rig = Rig::start(options).await?;
    let mut cri = rig.cri().await?;
    let map = || vec![IdMapping { host_id: 196_608, container_id: 0, length: 65_536 }];
    let userns = || UserNamespace { mode: NamespaceMode::Pod as i32, uids: map(), gids: map() };
    let mut cfg = rig.pod_config("builtin-userns");
    pod_ns(&mut cfg).userns_options = Some(userns());
    let pod = cri.run_pod(&cfg, "corral").await?;
    let holder = probe::holder_of(&pod).context("the pod's holder")?;
    let mut ctr = container_config("app", "exec sleep 1000");
    container_ns(&mut ctr).userns_options = Some(userns());
    let security =
        ctr.linux.as_mut().and_then(|l| l.security_context.as_mut()).context("security context")?;
    security.seccomp =
        Some(SecurityProfile { profile_type: ProfileType::RuntimeDefault as i32, ..Default::default() });
    let c = cri.run_container(&pod, &cfg, &ctr).await.context("a container of a hostUsers:false pod")?;

    let pid = cri.container_pid(&c).await?;
    let uid_map = std::fs::read_to_string(format!("/proc/{pid}/uid_map"))?;
    assert_eq!(uid_map.split_whitespace().collect::<Vec<_>>(), ["0", "196608", "65536"], "CRI's mapping");
    assert_eq!(
        probe::ns(pid, "user")?,
        probe::ns(holder, "user")?,
        "the init is in the pod's user namespace"
    );
    // An exec'd process: root of the pod's user namespace (CRI's mapping, not the host's),
    // under the container's seccomp filter, in the container's cgroup.
    let script =
        "cat /proc/self/uid_map; id -u; grep ^Seccomp: /proc/self/status; readlink /proc/self/ns/user";
    let (code, out, err) = cri.exec_sync(&c, &["sh", "-c", script]).await?;
    assert_eq!(code, 0, "exec into a user-namespaced container: {err}");
    let words: Vec<_> = out.split_whitespace().collect();
    assert_eq!(words[..4], ["0", "196608", "65536", "0"], "the exec'd process is the pod's root: {out}");
    assert_eq!(words[4..6], ["Seccomp:", "2"], "the container's seccomp filter: {out}");
    let holder_ns = std::fs::read_link(format!("/proc/{holder}/ns/user"))?;
    assert_eq!(words[6], holder_ns.to_string_lossy(), "the exec joined the pod's user namespace");
    let (code, out, err) =
        cri.exec_sync(&c, &["sh", "-c", "touch /root-owned && stat -c %u /root-owned"]).await?;
    assert_eq!((code, out.trim()), (0, "0"), "root inside may write its rootfs: {err}");
    cri.stop_and_remove_pod(&pod).await?;
    assert_no_mounts_left(&[&c]).await?;
    Ok(())
}

/// A container whose user the pod's user namespace does not fully map (a supplementary group
/// 70000 of a 65536-id mapping; containerd checks the uid and gid itself, but not these) cannot be
/// set up: the runtime's setgroups fails half-way through the container's setup. The error
/// names the call (runc: "setgroups: invalid argument"; the builtin runtime also lists the
/// groups), and nothing is left of the container: no process, runtime state, mount or idmapped
/// copy. The pod goes on. Whatever runtime this run uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_the_pod_does_not_map_fails_naming_it_and_leaves_nothing() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("userns-bad-user");
    pod_ns(&mut cfg).userns_options = Some(userns_pod());
    let pod = cri.run_pod(&cfg, "corral").await?;
    let mut ctr = container_config("unmapped", "true");
    container_ns(&mut ctr).userns_options = Some(userns_pod());
    let security =
        ctr.linux.as_mut().and_then(|l| l.security_context.as_mut()).context("security context")?;
    security.supplemental_groups = vec![70_000];
    let (id, err) = match cri.create_container(&pod, &cfg, &ctr).await {
        Err(e) => (None, e.to_string()),
        Ok(id) => match cri.start_container(&id).await {
            Err(e) => (Some(id), e.to_string()),
            Ok(()) => anyhow::bail!("a container with an unmapped group started"),
        },
    };
    eprintln!("unmapped group: {err}");
    assert!(err.contains("setgroups") || err.contains("set groups"), "the error names the call: {err}");
    if corral_rig::builtin_runtime() {
        assert!(err.contains("70000"), "the builtin runtime names the groups: {err}");
    }
    let id = id.context("CreateContainer accepted the container; the runtime refused it")?;
    assert!(probe::pids_in_cgroup_of(&id).is_empty(), "no process left");
    assert!(!corral_rig::runtime_root().join(&id).exists(), "no runtime state left");
    cri.remove_container(&id).await?;
    assert_no_mounts_left(&[&id]).await?;

    let c = cri
        .run_container(&pod, &cfg, &{
            let mut fine = container_config("fine", "exec sleep 1000");
            container_ns(&mut fine).userns_options = Some(userns_pod());
            fine
        })
        .await?;
    assert!(cri.container_pid(&c).await? > 0, "the pod still runs containers");
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}
