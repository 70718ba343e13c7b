//! User namespace mode POD: CRI makes the pod's netns inside a new user namespace; the holder
//! joins that user namespace first, so the pod's IPC and UTS namespaces are owned by it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use anyhow::{Context, Result};
use corral_rig::cri::pod_ns;
use corral_rig::{probe, Options, Rig};
use k8s_cri::v1::{IdMapping, NamespaceMode, UserNamespace};

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
