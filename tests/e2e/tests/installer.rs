//! The Kubernetes node installer (deploy/install-on-node.sh) on sample containerd configs, v3 and
//! v2: install is idempotent, keeps the rest of the file, yields a config doctor accepts; uninstall
//! restores the file byte for byte. And the manifests parse as the objects they claim to be.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use corral_rig::{direct::shim_binary, workspace};

const V3: &str = r#"# containerd config of a node, with comments that must survive
version = 3
root = "/var/lib/containerd"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"   # the default handler
"#;

const V2: &str = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"#;

fn run(host: &Path, action: &str) -> Result<String> {
    let out = Command::new("sh")
        .arg(workspace().join("deploy/install-on-node.sh"))
        .arg(action)
        .env("HOST_ROOT", host)
        .env("SHIM", shim_binary())
        .env("RESTART", format!("echo restarted >> {}", host.join("restarts").display()))
        .output()?;
    anyhow::ensure!(out.status.success(), "{action}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

fn host_with(config: &str, tag: &str) -> Result<PathBuf> {
    let host = std::env::temp_dir().join(format!("corral-installer-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host);
    std::fs::create_dir_all(host.join("etc/containerd"))?;
    std::fs::write(host.join("etc/containerd/config.toml"), config)?;
    Ok(host)
}

fn check(original: &str, plugin: &str, tag: &str) -> Result<()> {
    let host = host_with(original, tag)?;
    let config = host.join("etc/containerd/config.toml");
    run(&host, "install")?;
    run(&host, "install")?;
    let text = std::fs::read_to_string(&config)?;
    assert!(text.starts_with(original), "the rest of the file is kept:\n{text}");
    assert_eq!(text.matches("runtimes.corral]").count(), 1, "installed once:\n{text}");
    let parsed: toml::Table = toml::from_str(&text)?;
    let handler = &parsed["plugins"][plugin]["containerd"]["runtimes"]["corral"];
    assert_eq!(handler["runtime_type"].as_str(), Some("io.containerd.corral.v2"));
    assert_eq!(handler["sandboxer"].as_str(), Some("shim"));
    let node = &parsed["plugins"][plugin]["containerd"]["runtimes"]["corral-node"];
    assert_eq!(node["runtime_type"].as_str(), Some("io.containerd.corral-node.v2"));
    assert_eq!(node["sandboxer"].as_str(), Some("shim"));
    let bin = host.join("usr/local/bin/containerd-shim-corral-v2");
    assert!(bin.exists(), "binary installed");
    let link = host.join("usr/local/bin/containerd-shim-corral-node-v2");
    assert_eq!(std::fs::read_link(&link)?, Path::new("containerd-shim-corral-v2"), "node-mode link");
    let oci = host.join("usr/local/bin/corral-oci");
    let helper = shim_binary().with_file_name("corral-oci");
    assert_eq!(
        std::fs::read(&oci)?,
        std::fs::read(&helper)?,
        "the builtin runtime installed beside the shim"
    );
    if plugin == "io.containerd.cri.v1.runtime" {
        let doctor =
            Command::new(shim_binary()).arg("doctor").arg("-containerd-config").arg(&config).output()?;
        let report = String::from_utf8_lossy(&doctor.stdout);
        assert!(report.contains("handler \"corral\" uses corral as its sandboxer"), "{report}");
    }

    run(&host, "uninstall")?;
    assert_eq!(std::fs::read_to_string(&config)?, original, "uninstall restores the file");
    assert!(!bin.exists(), "binary removed");
    assert!(std::fs::symlink_metadata(&link).is_err(), "link removed");
    assert!(!oci.exists(), "builtin runtime removed");
    assert_eq!(
        std::fs::read_to_string(host.join("restarts"))?.lines().count(),
        3,
        "containerd restarted each time"
    );
    std::fs::remove_dir_all(&host)?;
    Ok(())
}

#[test]
fn the_node_installer_adds_and_removes_the_handler() -> Result<()> {
    check(V3, "io.containerd.cri.v1.runtime", "v3")?;
    check(V2, "io.containerd.grpc.v1.cri", "v2")?;
    check("", "io.containerd.grpc.v1.cri", "empty")
}

#[test]
fn the_manifests_are_the_objects_they_claim() -> Result<()> {
    let kinds = |file: &str| -> Result<String> {
        let script = "import sys, yaml\nfor d in yaml.safe_load_all(open(sys.argv[1])):\n    print(d['apiVersion'], d['kind'], d['metadata']['name'], d.get('handler', ''))";
        let out = Command::new("python3").args(["-c", script]).arg(workspace().join(file)).output()?;
        anyhow::ensure!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    assert_eq!(
        kinds("deploy/runtimeclass.yaml")?,
        "node.k8s.io/v1 RuntimeClass corral corral\nnode.k8s.io/v1 RuntimeClass corral-node corral-node\n"
    );
    assert_eq!(
        kinds("deploy/corral-deploy.yaml")?,
        "v1 ServiceAccount corral-deploy \napps/v1 DaemonSet corral-deploy \n"
    );
    Ok(())
}

/// The DaemonSet's pod template from deploy/corral-deploy.yaml, as JSON.
fn daemonset_pod_template() -> Result<serde_json::Value> {
    let script = "import sys, yaml, json\nfor d in yaml.safe_load_all(open(sys.argv[1])):\n    if d['kind'] == 'DaemonSet': print(json.dumps(d['spec']['template']['spec']))";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(workspace().join("deploy/corral-deploy.yaml"))
        .output()?;
    anyhow::ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The installer image (scripts/build-installer-image.sh) run the way the DaemonSet runs it, in a
/// privileged hostPID pod (on corral itself), with a scratch directory as the node's root:
/// it installs the shim and the handler, and its preStop hook removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installer_image_installs_and_its_prestop_uninstalls() -> Result<()> {
    use corral_rig::cri::{container_config, pod_ns};
    use k8s_cri::v1::{ImageSpec, KeyValue, Mount, NamespaceMode};

    let rig = corral_rig::Rig::start(corral_rig::Options::default()).await?;
    let template = daemonset_pod_template()?;
    let spec = &template["containers"][0];
    let image = spec["image"].as_str().unwrap_or_default();
    assert_eq!(
        image,
        format!("corral/corral-deploy:{}", env!("CARGO_PKG_VERSION")),
        "the image the build names"
    );

    let tar = rig.dir.join("corral-deploy.tar");
    let built = Command::new("bash")
        .arg(workspace().join("scripts/build-installer-image.sh"))
        .arg(&tar)
        .arg(shim_binary())
        .output()?;
    anyhow::ensure!(built.status.success(), "build: {}", String::from_utf8_lossy(&built.stderr));
    rig.ctr(&["images", "import", &tar.display().to_string()])?;

    let host = host_with(V3, "image")?;
    let restarts = host.join("restarts");
    let mut cri = rig.cri().await?;
    let mut cfg = rig.pod_config("corral-deploy");
    assert_eq!(template["hostPID"], true);
    pod_ns(&mut cfg).pid = NamespaceMode::Node as i32;
    cfg.linux.as_mut().unwrap().security_context.as_mut().unwrap().privileged = true;
    let pod = cri.run_pod(&cfg, "corral").await?;

    let mut config = container_config("install", "");
    config.image = Some(ImageSpec { image: format!("docker.io/{image}"), ..Default::default() });
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
    };
    config.command = strings(&spec["command"]);
    config.args = strings(&spec["args"]);
    config.envs = spec["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| KeyValue {
            key: e["name"].as_str().unwrap().into(),
            value: e["value"].as_str().unwrap().into(),
        })
        .collect();
    // The node's containerd is not restarted here: the restart command leaves a mark instead.
    config.envs.push(KeyValue { key: "RESTART".into(), value: "echo restarted >> /host/restarts".into() });
    let host_mount = spec["volumeMounts"][0]["mountPath"].as_str().unwrap().to_string();
    config.mounts = vec![Mount {
        container_path: host_mount,
        host_path: host.display().to_string(),
        ..Default::default()
    }];
    let security = config.linux.as_mut().unwrap().security_context.as_mut().unwrap();
    security.privileged = spec["securityContext"]["privileged"] == true;
    security.namespace_options.as_mut().unwrap().pid = NamespaceMode::Node as i32;
    let c = cri.run_container(&pod, &cfg, &config).await?;

    corral_rig::eventually(std::time::Duration::from_secs(10), || {
        (!restarts.exists()).then(|| format!("not installed yet: {}", rig.log_tail(5)))
    })
    .await?;
    let installed = host.join("usr/local/bin/containerd-shim-corral-v2");
    assert_eq!(std::fs::read(&installed)?, std::fs::read(shim_binary())?, "the image's shim is installed");
    let oci = host.join("usr/local/bin/corral-oci");
    assert_eq!(
        std::fs::read(&oci)?,
        std::fs::read(shim_binary().with_file_name("corral-oci"))?,
        "and corral-oci"
    );
    let text = std::fs::read_to_string(host.join("etc/containerd/config.toml"))?;
    assert!(text.starts_with(V3) && text.contains("runtimes.corral]"), "{text}");
    let state = cri.container_status(&c).await?.status.map(|s| s.state);
    assert_eq!(state, Some(k8s_cri::v1::ContainerState::ContainerRunning as i32), "it then sleeps");

    // What kubelet runs before stopping the pod: the preStop hook.
    let pre_stop = strings(&spec["lifecycle"]["preStop"]["exec"]["command"]);
    let pre_stop: Vec<&str> = pre_stop.iter().map(String::as_str).collect();
    let (code, _, err) = cri.exec_sync(&c, &pre_stop).await?;
    assert_eq!(code, 0, "preStop: {err}");
    assert_eq!(std::fs::read_to_string(host.join("etc/containerd/config.toml"))?, V3, "config restored");
    assert!(!installed.exists(), "shim removed");
    assert!(!oci.exists(), "corral-oci removed");
    assert_eq!(std::fs::read_to_string(&restarts)?.lines().count(), 2);

    cri.stop_and_remove_pod(&pod).await?;
    std::fs::remove_dir_all(&host)?;
    Ok(())
}
