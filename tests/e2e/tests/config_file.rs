//! corral's config file, set for the shims through containerd's shim-manager `env`
//! (`CORRAL_CONFIG`): its settings reach the pod, and a bad file fails RunPodSandbox with the key
//! named.

use anyhow::Result;
use corral_rig::cri::container_config;
use corral_rig::{Options, Rig};

fn config_file(name: &str, text: &str) -> Result<String> {
    let path = format!("/run/corral-rig/{name}-{}.toml", std::process::id());
    std::fs::create_dir_all("/run/corral-rig")?;
    std::fs::write(&path, text)?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_from_the_config_file_reach_the_pod() -> Result<()> {
    let path = config_file(
        "good",
        "[pod]\nshm_size = \"8Mi\"\ndefault_sysctls = false\n[log]\nlevel = \"debug\"\n",
    )?;
    let rig =
        Rig::start(Options { shim_env: vec![format!("CORRAL_CONFIG={path}")], ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("configured");
    let pod = cri.run_pod(&cfg, "corral").await?;
    let c = cri.run_container(&pod, &cfg, &container_config("app", "exec sleep 1000")).await?;
    let (_, mounts, _) = cri.exec_sync(&c, &["grep", " /dev/shm ", "/proc/mounts"]).await?;
    assert!(mounts.contains("size=8192k"), "{mounts}");
    // No containerd defaults: the pod's netns keeps the kernel's values.
    let (_, start, _) = cri.exec_sync(&c, &["cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"]).await?;
    assert_eq!(start, "1024\n");
    cri.stop_and_remove_pod(&pod).await?;
    std::fs::remove_file(path)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_file_is_refused_naming_the_key() -> Result<()> {
    let path = config_file("bad", "[pod]\nshm = \"1G\"\n")?;
    let rig =
        Rig::start(Options { shim_env: vec![format!("CORRAL_CONFIG={path}")], ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    let cfg = rig.pod_config("misconfigured");
    let err = cri.run_pod(&cfg, "corral").await.expect_err("RunPodSandbox must fail").to_string();
    assert!(err.contains(&path) && err.contains("unknown field `shm`"), "{err}");
    std::fs::remove_file(path)?;
    Ok(())
}

/// A handler with an `options` table: containerd passes it to `start` as runtime options
/// (`runtimeoptions.v1.Options` with the table as TOML). containerd 2.1.9 does so for the
/// sandbox, so the pod gets the handler's settings; its containers cannot start with such a
/// handler before containerd 2.4 (a containerd bug, see the README), so only the pod is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_options_table_reaches_the_pod_and_a_bad_key_is_named() -> Result<()> {
    let handler = |name: &str, options: &str| {
        format!(
            "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{name}]\n  runtime_type = \"io.containerd.corral.v2\"\n  sandboxer = \"shim\"\n\
             [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{name}.options.pod]\n{options}\n"
        )
    };
    let extra =
        handler("corral-opts", "  shm_size = \"24Mi\"") + &handler("corral-badopts", "  shm = \"1G\"");
    let rig = Rig::start(Options { extra_config: extra, ..Default::default() }).await?;
    let mut cri = rig.cri().await?;

    let cfg = rig.pod_config("optioned");
    let pod = cri.run_pod(&cfg, "corral-opts").await?;
    // The pod's /dev/shm, mounted by corral on the host under the sandbox bundle.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let shm: Vec<&str> = mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|mp| mp.contains(&pod) && mp.ends_with("/shm")))
        .collect();
    assert!(shm.iter().any(|m| m.contains("size=24576k")), "pod shm mounts: {shm:?}");
    cri.stop_and_remove_pod(&pod).await?;

    let cfg = rig.pod_config("badly-optioned");
    let err = cri.run_pod(&cfg, "corral-badopts").await.expect_err("RunPodSandbox must fail").to_string();
    assert!(err.contains("runtime options") && err.contains("unknown field `shm`"), "{err}");
    Ok(())
}
