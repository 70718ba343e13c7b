//! Bad input, sent straight to a shim the way containerd would send it: each request gets a
//! precise error with the right code naming the field, nothing panics, and nothing is left
//! behind (no holder, no mount, no pod files, no cgroup).

use std::collections::HashMap;

use anyhow::Result;
use containerd_shim_protos::api::*;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::sandbox_api::*;
use corral_rig::cri::pod_config;
use corral_rig::direct::{container_bundle, ctx, pod_options, DirectShim, TestNetns};
use corral_rig::{cgroup, probe};

/// The error's code name and message, as containerd would see them.
fn status(err: ttrpc::Error) -> (String, String) {
    match err {
        ttrpc::Error::RpcStatus(s) => (format!("{:?}", s.code()), s.message().to_string()),
        other => ("OTHER".into(), format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_precise_errors_and_leave_nothing() -> Result<()> {
    let id = format!("badinput-{}", std::process::id());
    let shim = DirectShim::start(&id).await?;
    let base = pod_config("bad", &shim.dir);
    let create = |options: MessageField<Any>, netns: &str, bundle: &std::path::Path| CreateSandboxRequest {
        sandbox_id: id.clone(),
        bundle_path: bundle.display().to_string(),
        options,
        netns_path: netns.into(),
        ..Default::default()
    };
    let any = |type_url: &str, value: Vec<u8>| {
        let mut a = Any::new();
        a.type_url = type_url.into();
        a.value = value;
        MessageField::some(a)
    };
    let mut bad_host = base.clone();
    bad_host.hostname = "no_underscores!".into();
    let mut bad_sysctl = base.clone();
    bad_sysctl.linux.as_mut().unwrap().sysctls = HashMap::from([("net..x".to_string(), "1".to_string())]);
    let mut bad_cgroup = base.clone();
    bad_cgroup.linux.as_mut().unwrap().cgroup_parent = "/kubepods/../../etc".into();
    let mut slice = base.clone();
    slice.linux.as_mut().unwrap().cgroup_parent = "corralbad.slice".into();
    let netns = TestNetns::new(&format!("crl-ns-{}", std::process::id()))?;
    let host_netns = netns.path.to_str().unwrap();

    let mut cases: Vec<(&str, CreateSandboxRequest, &str, &str)> = vec![
        (
            "no options",
            create(MessageField::none(), host_netns, &shim.bundle),
            "INVALID_ARGUMENT",
            "options: missing",
        ),
        (
            "garbage",
            create(any("runtime.v1.PodSandboxConfig", vec![0xff; 7]), host_netns, &shim.bundle),
            "INVALID_ARGUMENT",
            "options.value: not a PodSandboxConfig",
        ),
        (
            "wrong type",
            create(any("runtime.v1.ContainerConfig", vec![]), host_netns, &shim.bundle),
            "INVALID_ARGUMENT",
            "options.type_url",
        ),
        (
            "hostname",
            create(pod_options(&bad_host), host_netns, &shim.bundle),
            "INVALID_ARGUMENT",
            "PodSandboxConfig.hostname",
        ),
        (
            "sysctl",
            create(pod_options(&bad_sysctl), host_netns, &shim.bundle),
            "INVALID_ARGUMENT",
            "sysctls[\"net..x\"]",
        ),
        (
            "cgroup",
            create(pod_options(&bad_cgroup), host_netns, &shim.bundle),
            "INVALID_ARGUMENT",
            "cgroup_parent",
        ),
        (
            "not a netns",
            create(pod_options(&base), "/proc/self/ns/ipc", &shim.bundle),
            "UNKNOWN",
            "join network namespace /proc/self/ns/ipc",
        ),
        (
            "missing netns",
            create(pod_options(&base), "/run/netns/none-such", &shim.bundle),
            "NOT_FOUND",
            "open network namespace /run/netns/none-such",
        ),
        (
            "bundle elsewhere",
            create(pod_options(&base), host_netns, std::path::Path::new("/tmp")),
            "INVALID_ARGUMENT",
            "bundle_path",
        ),
    ];
    if !cgroup::systemd_is_init() {
        // A slice is the systemd driver's form; the holder's scope needs systemd to answer.
        let req = create(pod_options(&slice), host_netns, &shim.bundle);
        cases.push(("slice without systemd", req, "NOT_FOUND", "reach systemd at /run/systemd/private"));
    }
    for (what, req, code, needle) in cases {
        let err = shim.sandbox.create_sandbox(ctx(), &req).await.expect_err(what);
        let (got_code, message) = status(err);
        assert!(message.contains(needle), "{what}: {message}");
        if code != "NOT_FOUND" {
            assert_eq!(got_code, code, "{what}: {message}");
        }
        // Nothing half-created: no holder, no pod files, no mounts.
        assert!(
            probe::pids_with_cmdline(&id)
                .iter()
                .all(|p| probe::cmdline(*p as u32).get(1).map(String::as_str) != Some("holder")),
            "{what}: holder left"
        );
        assert!(!shim.bundle.join("pod").exists(), "{what}: pod files left");
        assert!(
            probe::mounts_containing(&id).is_empty(),
            "{what}: mounts left {:?}",
            probe::mounts_containing(&id)
        );
    }

    // A good pod, with a large annotation (kubelet allows 256 KiB in all).
    let mut good = base.clone();
    good.annotations = HashMap::from([("big".to_string(), "x".repeat(200 * 1024))]);
    shim.sandbox.create_sandbox(ctx(), &create(pod_options(&good), host_netns, &shim.bundle)).await?;
    let again =
        shim.sandbox.create_sandbox(ctx(), &create(pod_options(&good), host_netns, &shim.bundle)).await;
    assert_eq!(status(again.unwrap_err()).0, "ALREADY_EXISTS");
    let started = shim
        .sandbox
        .start_sandbox(ctx(), &StartSandboxRequest { sandbox_id: id.clone(), ..Default::default() })
        .await?;

    // Containers: unknown ids, missing or malformed config.json, a bundle elsewhere, duplicates.
    let err =
        shim.task.state(ctx(), &StateRequest { id: "ghost".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(status(err).0, "NOT_FOUND");
    let err = shim
        .task
        .kill(ctx(), &KillRequest { id: "ghost".into(), signal: 9, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status(err).0, "NOT_FOUND");
    let (bundle, rootfs) = container_bundle(&shim.dir, "c1", started.pid, &["sleep", "1000"])?;
    let task = |id: &str, bundle: &std::path::Path| CreateTaskRequest {
        id: id.into(),
        bundle: bundle.display().to_string(),
        rootfs: rootfs.clone(),
        ..Default::default()
    };
    let config = bundle.join("config.json");
    let saved = std::fs::read(&config)?;
    std::fs::remove_file(&config)?;
    let (code, message) = status(shim.task.create(ctx(), &task("c1", &bundle)).await.unwrap_err());
    assert!(code == "NOT_FOUND" && message.contains("config.json"), "{code} {message}");
    std::fs::write(&config, b"{not json")?;
    let (code, message) = status(shim.task.create(ctx(), &task("c1", &bundle)).await.unwrap_err());
    assert!(code == "INVALID_ARGUMENT" && message.contains("config.json: not JSON"), "{code} {message}");
    let (code, message) =
        status(shim.task.create(ctx(), &task("c1", std::path::Path::new("/etc"))).await.unwrap_err());
    assert!(code == "INVALID_ARGUMENT" && message.starts_with("bundle: \"/etc\""), "{code} {message}");
    let (code, message) = status(shim.task.create(ctx(), &task("../c1", &bundle)).await.unwrap_err());
    assert!(code == "INVALID_ARGUMENT" && message.starts_with("id: \"../c1\""), "{code} {message}");
    let left: Vec<_> = probe::mounts_under(&[&shim.dir]).into_iter().filter(|m| m.contains("c1")).collect();
    assert!(left.is_empty(), "no rootfs left mounted after refusals: {left:?}");
    std::fs::write(&config, saved)?;
    shim.task.create(ctx(), &task("c1", &bundle)).await?;
    let (code, _) = status(shim.task.create(ctx(), &task("c1", &bundle)).await.unwrap_err());
    assert_eq!(code, "ALREADY_EXISTS");

    shim.sandbox
        .stop_sandbox(ctx(), &StopSandboxRequest { sandbox_id: id.clone(), ..Default::default() })
        .await?;
    shim.shutdown_sandbox().await?;
    let (ok, _) = shim.delete_command(&id, &shim.bundle)?;
    assert!(ok);
    assert!(probe::mounts_containing(&id).is_empty());
    Ok(())
}
