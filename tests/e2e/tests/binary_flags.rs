//! The shim binary's own flags, as containerd and operators call them: `-v` and `-info`.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::Result;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::types::introspection::RuntimeInfo;
use corral_rig::cgroup;
use corral_rig::direct::shim_binary;

#[test]
fn version_names_the_release_and_commit() -> Result<()> {
    let out = Command::new(shim_binary()).arg("-v").output()?;
    let text = String::from_utf8(out.stdout)?;
    assert!(out.status.success());
    assert!(
        text.starts_with(&format!("containerd-shim-corral-v2 version {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    assert!(text.contains("(commit "), "{text}");
    Ok(())
}

/// Runs `-info` as containerd does (options on stdin) with extra environment; the RuntimeInfo.
fn info(env: &[(&str, &str)]) -> Result<RuntimeInfo> {
    let mut child = Command::new(shim_binary())
        .arg("-info")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    // containerd may send runtime options on stdin; corral reads and ignores them.
    child.stdin.take().unwrap().write_all(b"")?;
    let out = child.wait_with_output()?;
    assert!(out.status.success());
    Ok(RuntimeInfo::parse_from_bytes(&out.stdout)?)
}

#[test]
fn info_answers_a_runtime_info_with_the_runtime_features() -> Result<()> {
    let info = info(&[])?;
    assert_eq!(info.name, "io.containerd.corral.v2");
    assert_eq!(info.version.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(info.features.type_url, "types.containerd.io/opencontainers/runtime-spec/1/features/Features");
    let features: serde_json::Value = serde_json::from_slice(&info.features.value)?;
    // runc, or corral-oci under CORRAL_RUNC=builtin.
    let runc: serde_json::Value = serde_json::from_slice(
        &Command::new(corral_rig::runtime_program()).arg("features").output()?.stdout,
    )?;
    // What CRI reads: the runtime's mount options (rro among them on runc 1.1+) and namespaces.
    assert_eq!(features["mountOptions"], runc["mountOptions"]);
    assert!(features["mountOptions"].as_array().unwrap().contains(&"rro".into()), "{features}");
    assert_eq!(features["linux"]["namespaces"], runc["linux"]["namespaces"]);
    // runc 1.1.5 and corral-oci claim no idmapped mounts; corral makes them itself where the kernel can.
    assert_eq!(features["linux"]["mountExtensions"]["idmap"]["enabled"], kernel_maps_tmpfs(), "{features}");
    Ok(())
}

/// Whether this kernel idmaps tmpfs (6.3+), the last of the filesystems corral maps to get it.
fn kernel_maps_tmpfs() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 3)
}

#[test]
fn info_claims_idmapped_mounts_even_when_the_runtime_has_none() -> Result<()> {
    // A runtime that says it has no idmapped mounts: corral makes them before the runtime runs.
    let dir = std::env::temp_dir().join(format!("corral-info-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let fake = dir.join("runc");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho '{\"ociVersionMin\":\"1.0.0\",\"mountOptions\":[\"rro\"],\"linux\":{\"namespaces\":[\"user\"],\"mountExtensions\":{\"idmap\":{\"enabled\":false}}}}'\n",
    )?;
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let info = info(&[("CORRAL_RUNC", fake.to_str().unwrap())]);
    std::fs::remove_dir_all(&dir)?;
    let features: serde_json::Value = serde_json::from_slice(&info?.features.value)?;
    assert_eq!(features["mountOptions"], serde_json::json!(["rro"]));
    assert_eq!(features["linux"]["mountExtensions"]["idmap"]["enabled"], kernel_maps_tmpfs(), "{features}");
    Ok(())
}

/// Runs `doctor` on a containerd config text with extra environment; (success, output).
fn doctor(config: &str, env: &[(&str, &str)]) -> Result<(bool, String)> {
    let path =
        std::env::temp_dir().join(format!("corral-doctor-{}-{}.toml", std::process::id(), config.len()));
    std::fs::write(&path, config)?;
    let out = Command::new(shim_binary())
        .arg("doctor")
        .arg("-containerd-config")
        .arg(&path)
        .envs(env.iter().copied())
        .output()?;
    std::fs::remove_file(&path)?;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned()))
}

const HANDLER: &str = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral]\n  runtime_type = 'io.containerd.corral.v2'\n  sandboxer = 'shim'\n";

#[test]
fn doctor_passes_this_node_and_finds_broken_setups() -> Result<()> {
    let (ok, out) = doctor(HANDLER, &[])?;
    assert!(ok, "a correct setup: {out}");
    assert!(out.contains("corral can run on this node"), "{out}");

    let (ok, out) = doctor("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = 'io.containerd.runc.v2'\n", &[])?;
    assert!(!ok && out.contains("no runtime handler uses corral"), "{out}");

    let with_options = format!("{HANDLER}[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.corral.options]\n  BinaryName = 'runc'\n");
    let (ok, out) = doctor(&with_options, &[])?;
    assert!(!ok && out.contains("options table"), "{out}");

    let (ok, out) = doctor(HANDLER, &[("CORRAL_RUNC", "/nonexistent/runc")])?;
    assert!(!ok && out.contains("\"/nonexistent/runc\" cannot be run"), "{out}");

    // The systemd driver needs systemd to answer on its private socket (the holders' scopes).
    let forced = std::env::temp_dir().join(format!("corral-doctor-systemd-{}.toml", std::process::id()));
    std::fs::write(&forced, "[cgroup]\ndriver = \"systemd\"\n")?;
    let (ok, out) = doctor(HANDLER, &[("CORRAL_CONFIG", forced.to_str().unwrap())])?;
    std::fs::remove_file(&forced)?;
    if cgroup::systemd_is_init() {
        assert!(ok && out.contains("answers at /run/systemd/private"), "{out}");
    } else {
        assert!(!ok && out.contains("cgroup.driver = systemd, but pid 1 is"), "{out}");
    }
    Ok(())
}
