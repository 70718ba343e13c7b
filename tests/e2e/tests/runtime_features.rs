//! What CRI `Status` says the `corral` handler can do, and a recursive read-only mount.
//!
//! containerd fills a handler's features from the shim's `-info` answer, but 2.1.9 (and 2.2 before
//! 2.2.7, 2.3 before 2.3.4) only asks handlers whose runtime type is io.containerd.runc.v2
//! (internal/cri/server/service.go, introspectRuntimeFeatures): corral's handler gets no features
//! there, and CRI refuses its recursive read-only mounts. Later versions ask corral, whose answer
//! claims rro as runc does and idmapped mounts, which corral makes (see `binary_flags`). These tests pin both
//! sides to the containerd they run on, and show that rro really holds: through CRI where
//! containerd grants it, and through corral's Task API with the mount options CRI writes.
//!
//! Worse than a refusal: 2.1.9 dereferences the missing features when a CreateContainer for such a
//! handler asks for rro (internal/cri/opts/spec_linux_opts.go, withMounts) and crashes, so that
//! request is never sent to corral's handler here. kubelet does not send it: it reads the
//! handler's features from Status first and refuses the pod itself.

use std::path::Path;

use anyhow::{Context, Result};
use corral_rig::cri::container_config;
use corral_rig::{Options, Rig};
use k8s_cri::v1::{Mount, MountPropagation, RuntimeHandlerFeatures, StatusRequest, VersionRequest};

/// containerd's version from CRI's Version ("v2.1.9") as (major, minor, patch).
async fn containerd_version(cri: &mut corral_rig::Cri) -> Result<(u32, u32, u32)> {
    let v = cri.runtime.version(VersionRequest { version: String::new() }).await?.into_inner();
    let nums: Vec<u32> = v
        .runtime_version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .take(3)
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    Ok((nums[0], nums[1], *nums.get(2).unwrap_or(&0)))
}

/// Whether this containerd asks non-runc runtime types for their features.
fn introspects_any_runtime((major, minor, patch): (u32, u32, u32)) -> bool {
    (major, minor) > (2, 3) || (major, minor, patch) >= (2, 3, 4) || ((major, minor) == (2, 2) && patch >= 7)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_status_lists_corral_with_what_it_supports() -> Result<()> {
    let rig = Rig::start(Options::default()).await?;
    let mut cri = rig.cri().await?;
    let version = containerd_version(&mut cri).await?;
    let status = cri.runtime.status(StatusRequest { verbose: true }).await?.into_inner();
    let features = |name: &str| status.runtime_handlers.iter().find(|h| h.name == name).map(|h| h.features);
    let runc = features("runc").context("runc handler listed")?;
    let corral = features("corral").context("corral handler listed")?;
    // runc 1.1.5 on this kernel: rro yes, CRI user namespaces no (no idmapped mounts in 1.1).
    let rro_only = RuntimeHandlerFeatures { recursive_read_only_mounts: true, user_namespaces: false };
    assert_eq!(runc, Some(rro_only));
    if introspects_any_runtime(version) {
        // corral hands bind mounts to runc: rro as runc does; idmapped mounts corral makes.
        assert_eq!(
            corral,
            Some(RuntimeHandlerFeatures { recursive_read_only_mounts: true, user_namespaces: true })
        );
    } else {
        // containerd never ran corral's -info: no features at all for it.
        assert_eq!(corral, None, "containerd {version:?}");
    }
    Ok(())
}

/// A host directory with a tmpfs mounted on its `sub` directory, holding `sub/marker`.
struct SourceWithSubmount(std::path::PathBuf);

impl SourceWithSubmount {
    fn new(dir: &Path) -> Result<SourceWithSubmount> {
        std::fs::create_dir_all(dir.join("sub"))?;
        nix::mount::mount(
            Some("tmpfs"),
            &dir.join("sub"),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )?;
        std::fs::write(dir.join("sub/marker"), "submount")?;
        Ok(SourceWithSubmount(dir.to_path_buf()))
    }
}

impl Drop for SourceWithSubmount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0.join("sub"), nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recursive_read_only_mount_is_read_only_in_its_submounts() -> Result<()> {
    let rig = Rig::start(Options { pause_image: true, ..Default::default() }).await?;
    let mut cri = rig.cri().await?;
    let version = containerd_version(&mut cri).await?;
    let source = SourceWithSubmount::new(&rig.dir.join("rro-source"))?;
    let mount = Mount {
        container_path: "/data".into(),
        host_path: source.0.display().to_string(),
        readonly: true,
        recursive_read_only: true,
        propagation: MountPropagation::PropagationPrivate as i32,
        ..Default::default()
    };
    // corral's handler only where containerd knows its features (see the module doc).
    let handlers: &[&str] = if introspects_any_runtime(version) { &["runc", "corral"] } else { &["runc"] };
    for handler in handlers {
        let cfg = rig.pod_config(&format!("rro-{handler}"));
        let pod = cri.run_pod(&cfg, handler).await?;
        let mut c = container_config("app", "exec sleep 1000");
        c.mounts = vec![mount.clone()];
        let c = cri.run_container(&pod, &cfg, &c).await?;
        // The submount is there (a plain "ro" bind would leave it writable).
        assert_eq!(cri.exec_sync(&c, &["cat", "/data/sub/marker"]).await?.1, "submount", "{handler}");
        let (code, _, err) = cri.exec_sync(&c, &["touch", "/data/sub/written"]).await?;
        assert_ne!(code, 0, "{handler}: a write into the submount of an rro mount succeeded");
        assert!(err.contains("Read-only file system"), "{handler}: {err}");
        let (code, _, _) = cri.exec_sync(&c, &["touch", "/data/written"]).await?;
        assert_ne!(code, 0, "{handler}: a write into an rro mount succeeded");
        assert!(!source.0.join("sub/written").exists() && !source.0.join("written").exists());
        cri.stop_and_remove_pod(&pod).await?;
    }
    Ok(())
}

/// Below CRI: a corral container with the bind mount CRI writes for readonly +
/// recursive_read_only (options rbind, rprivate, rro) cannot write into the submount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corral_gives_runc_the_rro_mount_cri_writes() -> Result<()> {
    use containerd_shim_protos::api::{CreateTaskRequest, DeleteRequest, StartRequest, WaitRequest};
    use corral_rig::direct::{container_bundle, ctx, DirectShim};

    let id = format!("rro-{}", std::process::id());
    let (shim, _netns, holder) = DirectShim::with_pod(&id, "rro").await?;
    let source = SourceWithSubmount::new(&shim.dir.join("rro-source"))?;
    let out = shim.dir.join("out");
    std::fs::create_dir_all(&out)?;
    let cid = format!("{id}-app");
    let script =
        "cat /data/sub/marker >/out/marker; touch /data/sub/written 2>/out/sub.err; echo $? >/out/sub.code; \
                  touch /data/written 2>/dev/null; echo $? >/out/top.code";
    let (bundle, rootfs) = container_bundle(&shim.dir, &cid, holder, &["sh", "-c", script])?;
    let config = bundle.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&config)?)?;
    let mounts = spec["mounts"].as_array_mut().context("runc spec has mounts")?;
    mounts.push(serde_json::json!({"destination": "/data", "type": "bind", "source": source.0,
        "options": ["rbind", "rprivate", "rro"]}));
    mounts.push(serde_json::json!({"destination": "/out", "type": "bind", "source": out,
        "options": ["rbind", "rprivate", "rw"]}));
    std::fs::write(&config, serde_json::to_vec(&spec)?)?;
    std::fs::write(bundle.join("sandbox"), &id)?;
    let create = CreateTaskRequest {
        id: cid.clone(),
        bundle: bundle.display().to_string(),
        rootfs,
        ..Default::default()
    };
    shim.task.create(ctx(), &create).await?;
    shim.task.start(ctx(), &StartRequest { id: cid.clone(), ..Default::default() }).await?;
    let waited = shim.task.wait(ctx(), &WaitRequest { id: cid.clone(), ..Default::default() }).await?;
    assert_eq!(waited.exit_status, 0);
    let read = |f: &str| std::fs::read_to_string(out.join(f)).unwrap_or_default();
    assert_eq!(read("marker"), "submount", "the submount is visible in the container");
    assert_ne!(read("sub.code").trim(), "0", "a write into the submount succeeded");
    assert!(read("sub.err").contains("Read-only file system"), "{}", read("sub.err"));
    assert_ne!(read("top.code").trim(), "0", "a write into the mount succeeded");
    assert!(!source.0.join("sub/written").exists());
    shim.task.delete(ctx(), &DeleteRequest { id: cid.clone(), ..Default::default() }).await?;
    shim.shutdown_sandbox().await?;
    Ok(())
}
