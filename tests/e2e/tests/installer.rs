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
    let bin = host.join("usr/local/bin/containerd-shim-corral-v2");
    assert!(bin.exists(), "binary installed");
    if plugin == "io.containerd.cri.v1.runtime" {
        let doctor =
            Command::new(shim_binary()).arg("doctor").arg("-containerd-config").arg(&config).output()?;
        let report = String::from_utf8_lossy(&doctor.stdout);
        assert!(report.contains("handler \"corral\" uses corral as its sandboxer"), "{report}");
    }

    run(&host, "uninstall")?;
    assert_eq!(std::fs::read_to_string(&config)?, original, "uninstall restores the file");
    assert!(!bin.exists(), "binary removed");
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
    assert_eq!(kinds("deploy/runtimeclass.yaml")?, "node.k8s.io/v1 RuntimeClass corral corral\n");
    assert_eq!(
        kinds("deploy/corral-deploy.yaml")?,
        "v1 ServiceAccount corral-deploy \napps/v1 DaemonSet corral-deploy \n"
    );
    Ok(())
}
