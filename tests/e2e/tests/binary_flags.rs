//! The shim binary's own flags, as containerd and operators call them: `-v` and `-info`.

use std::io::Write;
use std::process::{Command, Stdio};

use anyhow::Result;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::types::introspection::RuntimeInfo;
use corral_rig::direct::shim_binary;

#[test]
fn version_names_the_release_and_commit() -> Result<()> {
    let out = Command::new(shim_binary()).arg("-v").output()?;
    let text = String::from_utf8(out.stdout)?;
    assert!(out.status.success());
    assert!(
        text.starts_with(&format!(
            "containerd-shim-corral-v2 version {}",
            env!("CARGO_PKG_VERSION")
        )),
        "{text}"
    );
    assert!(text.contains("(commit "), "{text}");
    Ok(())
}

#[test]
fn info_answers_a_runtime_info_with_runc_features() -> Result<()> {
    let mut child = Command::new(shim_binary())
        .arg("-info")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    // containerd may send runtime options on stdin; corral reads and ignores them.
    child.stdin.take().unwrap().write_all(b"")?;
    let out = child.wait_with_output()?;
    assert!(out.status.success());
    let info = RuntimeInfo::parse_from_bytes(&out.stdout)?;
    assert_eq!(info.name, "io.containerd.corral.v2");
    assert_eq!(info.version.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(
        info.features.type_url,
        "types.containerd.io/opencontainers/runtime-spec/1/features/Features"
    );
    let features: serde_json::Value = serde_json::from_slice(&info.features.value)?;
    assert!(
        features["ociVersionMin"].is_string(),
        "runc's features document: {features}"
    );
    Ok(())
}
