//! The pod's files and /dev/shm, as containers see them: hostname, hosts, resolv.conf from the
//! pod's DNS config, one shared /dev/shm. Run on corral and on containerd's pause sandbox (`runc`
//! handler): the containers must see the same thing.

use std::time::Duration;

use anyhow::Result;
use corral_rig::cri::{container_config, Cri};
use corral_rig::{Options, Rig};
use k8s_cri::v1::DnsConfig;

struct Seen {
    hostname: String,
    etc_hostname: String,
    resolv: String,
    hosts_matches_node: bool,
    shm_shared: String,
    sysv_shared: bool,
    shm_mount: String,
    readonly_write_fails: bool,
}

async fn observe(rig: &Rig, cri: &mut Cri, handler: &str) -> Result<Seen> {
    let name = format!("files-{handler}");
    let mut cfg = rig.pod_config(&name);
    cfg.dns_config = Some(DnsConfig {
        servers: vec!["10.96.0.10".into()],
        searches: vec!["default.svc.cluster.local".into(), "svc.cluster.local".into()],
        options: vec!["ndots:5".into()],
    });
    let pod = cri.run_pod(&cfg, handler).await?;
    let a = cri.run_container(&pod, &cfg, &container_config("a", "exec sleep 1000")).await?;
    let mut ro = container_config("b", "exec sleep 1000");
    ro.linux.as_mut().unwrap().security_context.as_mut().unwrap().readonly_rootfs = true;
    let b = cri.run_container(&pod, &cfg, &ro).await?;

    let read = |out: (i32, String, String)| out.1;
    let hostname = read(cri.exec_sync(&a, &["hostname"]).await?);
    let etc_hostname = read(cri.exec_sync(&a, &["cat", "/etc/hostname"]).await?);
    let resolv = read(cri.exec_sync(&a, &["cat", "/etc/resolv.conf"]).await?);
    let hosts = read(cri.exec_sync(&a, &["cat", "/etc/hosts"]).await?);
    let node_hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    // One /dev/shm per pod: a file written by one container is read by the other.
    cri.exec_sync(&a, &["sh", "-c", "echo shared-by-a > /dev/shm/note"]).await?;
    let shm_shared = read(cri.exec_sync(&b, &["cat", "/dev/shm/note"]).await?);
    // And one IPC namespace (what SysV segments and message queues live in), as each
    // container sees it from inside. (busybox has no ipcmk to make a segment.)
    let ipc_a = read(cri.exec_sync(&a, &["readlink", "/proc/self/ns/ipc"]).await?);
    let ipc_b = read(cri.exec_sync(&b, &["readlink", "/proc/self/ns/ipc"]).await?);
    let sysv_shared = !ipc_a.is_empty() && ipc_a == ipc_b;
    let shm_mount = read(cri.exec_sync(&a, &["sh", "-c", "grep ' /dev/shm ' /proc/mounts"]).await?);
    let (code, _, _) = cri.exec_sync(&b, &["sh", "-c", "echo x >> /etc/resolv.conf"]).await?;

    cri.stop_and_remove_pod(&pod).await?;
    Ok(Seen {
        hostname,
        etc_hostname,
        resolv,
        hosts_matches_node: hosts == node_hosts,
        shm_shared,
        sysv_shared,
        shm_mount,
        readonly_write_fails: code != 0,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_see_the_pod_files_and_one_shm_like_on_the_pause_sandbox() -> Result<()> {
    let rig = Rig::start(Options { pause_image: true, ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    let corral = observe(&rig, &mut cri, "corral").await?;
    let pause =
        tokio::time::timeout(corral_rig::scaled(Duration::from_secs(60)), observe(&rig, &mut cri, "runc"))
            .await??;

    assert_eq!(corral.hostname, "files-corral\n");
    assert_eq!(corral.etc_hostname, "files-corral\n");
    assert_eq!(
        corral.resolv,
        "search default.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
    );
    assert!(corral.hosts_matches_node, "/etc/hosts is the node's, as containerd writes it");
    assert_eq!(corral.shm_shared, "shared-by-a\n");
    assert!(corral.sysv_shared, "both containers are in the pod's IPC namespace");
    assert!(corral.readonly_write_fails, "a read-only rootfs gets read-only pod files");
    for opt in ["tmpfs", "nosuid", "nodev", "noexec", "size=65536k"] {
        assert!(corral.shm_mount.contains(opt), "/dev/shm lacks {opt}: {}", corral.shm_mount);
    }

    // The pause sandbox shows the same (modulo the pod name).
    assert_eq!(pause.hostname, "files-runc\n");
    assert_eq!(pause.etc_hostname, corral.etc_hostname.replace("corral", "runc"));
    assert_eq!(pause.resolv, corral.resolv);
    assert_eq!(pause.hosts_matches_node, corral.hosts_matches_node);
    assert_eq!(pause.shm_shared, corral.shm_shared);
    assert_eq!(pause.sysv_shared, corral.sysv_shared);
    assert_eq!(pause.readonly_write_fails, corral.readonly_write_fails);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_shm_size_is_configurable() -> Result<()> {
    let rig =
        Rig::start(Options { shim_env: vec!["CORRAL_SHM_SIZE=16Mi".into()], ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("shm-size");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
    let (_, mounts, _) = cri.exec_sync(&c, &["grep", " /dev/shm ", "/proc/mounts"]).await?;
    assert!(mounts.contains("size=16384k"), "{mounts}");
    cri.stop_and_remove_pod(&pod).await?;
    Ok(())
}
