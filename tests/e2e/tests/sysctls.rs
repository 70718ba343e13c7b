//! Pod sysctls: applied inside the pod's namespaces (as on the pause sandbox), the host's values
//! never change, and a sysctl that would change the host is refused with nothing left behind.
//! Keys with a literal dot (an interface named `d0.100`) are written to that interface's file in
//! both spellings kubelet accepts; that one runs below CRI, since CRI always names the pod's
//! interface eth0 and no sysctl name with a dot exists in a fresh network namespace.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{ensure, Result};
use corral_rig::cri::{container_config, pod_config, Cri};
use corral_rig::direct::{DirectShim, TestNetns};
use corral_rig::{eventually, probe, Options, Rig};

const KEYS: [&str; 4] = [
    "net/ipv4/ip_local_port_range",
    "kernel/shmmni",
    "net/ipv4/ping_group_range",
    "net/ipv4/ip_unprivileged_port_start",
];

fn host_values() -> Vec<String> {
    KEYS.iter().map(|k| std::fs::read_to_string(format!("/proc/sys/{k}")).unwrap_or_default()).collect()
}

async fn values_in_pod(rig: &Rig, cri: &mut Cri, handler: &str) -> Result<Vec<String>> {
    let name = format!("sysctl-{handler}");
    let mut cfg = rig.pod_config(&name);
    cfg.linux.as_mut().unwrap().sysctls = HashMap::from([
        ("net.ipv4.ip_local_port_range".to_string(), "20000 30000".to_string()),
        ("kernel.shmmni".to_string(), "2048".to_string()),
    ]);
    let pod = cri.run_pod(&cfg, handler).await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
    let mut values = Vec::new();
    for key in KEYS {
        values.push(cri.exec_sync(&c, &["cat", &format!("/proc/sys/{key}")]).await?.1);
    }
    cri.stop_and_remove_pod(&pod).await?;
    Ok(values)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_sysctls_apply_inside_the_pod_and_never_on_the_host() -> Result<()> {
    let rig = Rig::start(Options { pause_image: true, ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    let host_before = host_values();

    let corral = values_in_pod(&rig, &mut cri, "corral").await?;
    assert_eq!(corral[0], "20000\t30000\n");
    assert_eq!(corral[1], "2048\n");
    // containerd's defaults for pods with their own network namespace.
    assert_eq!(corral[2], "0\t2147483647\n");
    assert_eq!(corral[3], "0\n");
    assert_eq!(host_values(), host_before, "the host's sysctls are unchanged");

    let pause = values_in_pod(&rig, &mut cri, "runc").await?;
    assert_eq!(pause, corral, "the pause sandbox applies the same values");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_level_sysctl_is_refused_naming_the_key_and_nothing_is_left() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let sockets = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir("/run/corral/s")
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let sockets_before = sockets();

    for (key, value, why) in [
        ("kernel.panic", "1", "not a namespaced sysctl"),
        ("net.ipv4.ip_forward", "1\n0", "control characters"),
    ] {
        let mut cfg = rig.pod_config("refused");
        cfg.linux.as_mut().unwrap().sysctls = HashMap::from([(key.to_string(), value.to_string())]);
        let err = cri.run_pod(&cfg, "corral").await.expect_err("RunPodSandbox must fail").to_string();
        assert!(err.contains(&format!("sysctls[{key:?}]")) && err.contains(why), "{err}");
    }

    let socket = rig.socket.display().to_string();
    eventually(Duration::from_secs(5), || {
        let shims = probe::pids_with_cmdline(&socket);
        (!shims.is_empty()).then(|| format!("shim processes left: {shims:?}"))
    })
    .await?;
    // (No holder can be left: corral validates the config before it spawns one, and every
    // process it spawns carries the rig's socket or is a child of one that does.)
    let mounts = probe::mounts_under(&[&rig.state, &rig.root]);
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
    // Tests run in parallel: a new socket is a leak only if no server answers on it.
    let stale: Vec<_> = sockets()
        .into_iter()
        .filter(|s| !sockets_before.contains(s) && std::os::unix::net::UnixStream::connect(s).is_err())
        .collect();
    assert!(stale.is_empty(), "stale sockets left: {stale:?}");
    let bundles = rig.state.join("io.containerd.sandbox.controller.v1.shim/k8s.io");
    let left: Vec<_> =
        std::fs::read_dir(&bundles).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "sandbox bundles left: {left:?}");
    assert!(cri
        .runtime
        .list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest { filter: None })
        .await?
        .into_inner()
        .items
        .is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sysctl_of_an_interface_with_a_dot_in_its_name_reaches_its_file_in_both_spellings() -> Result<()> {
    let id = format!("dotif-{}", std::process::id());
    let shim = DirectShim::start(&id).await?;
    let netns = TestNetns::new(&format!("crl-dot-{}", std::process::id()))?;
    let ip = |args: &[&str]| std::process::Command::new("ip").args(["-n", &netns.name]).args(args).output();
    // A veth (the dummy driver is not built on every node; veth is, for CNI).
    let made = ip(&["link", "add", "d0.100", "type", "veth", "peer", "name", "d1"])?;
    ensure!(made.status.success(), "ip link add d0.100: {}", String::from_utf8_lossy(&made.stderr));

    let mut cfg = pod_config("dotif", &shim.dir);
    cfg.linux.as_mut().unwrap().sysctls = HashMap::from([
        // sysctl(8)'s spelling: slashes separate, the dot is the name's.
        ("net/ipv4/conf/d0.100/forwarding".to_string(), "1".to_string()),
        // kubelet's canonical spelling of the same: dots separate, a slash is the name's dot.
        ("net.ipv4.conf.d0/100.rp_filter".to_string(), "2".to_string()),
    ]);
    let holder = shim.run_pod(&cfg, &netns.path.display().to_string()).await?;
    let netns_inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&netns.path)?);
    assert_eq!(probe::ns(holder, "net")?, format!("net:[{netns_inode}]"), "the holder is in the test netns");
    let read = |key: &str| -> Result<String> {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &netns.name, "cat", &format!("/proc/sys/net/ipv4/conf/d0.100/{key}")])
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    assert_eq!(read("forwarding")?, "1");
    assert_eq!(read("rp_filter")?, "2");

    shim.shutdown_sandbox().await?;
    Ok(())
}
