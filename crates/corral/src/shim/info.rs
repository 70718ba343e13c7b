//! `-info`: containerd asks a shim what its runtime supports (2.1 only for idmapped mounts; CRI's
//! runtime handler features from 2.2.7 / 2.3.4 on, which introspect any runtime type, while 2.1.9
//! and older 2.2 / 2.3 introspect io.containerd.runc.v2 handlers only and never run this). corral
//! answers a `RuntimeInfo` with its name and version and the OCI runtime's own `features`
//! document, adjusted to what corral does: containers' bind mounts go to runc as they are (so
//! runc's mount options, `rro` included, hold), and idmapped mounts are claimed whatever the
//! runtime says, since corral makes them itself (task::idmap) before runc sees the spec. With
//! them CRI reports user namespace support (it also needs "user" among runc's namespaces), and
//! 2.1 accepts containers whose bind mounts carry id mappings.

use std::io::{Read, Write};

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::types::introspection::{RuntimeInfo, RuntimeVersion};

use crate::error::{Error, IoContext, Result};

/// The type URL containerd decodes `features` with.
pub const FEATURES_TYPE: &str = "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// Builds the RuntimeInfo; `features` is the output of `<runtime> features` (JSON).
pub fn runtime_info(version: &str, revision: &str, features: Option<Vec<u8>>) -> RuntimeInfo {
    let mut info = RuntimeInfo::new();
    info.name = "io.containerd.corral.v2".into();
    let mut v = RuntimeVersion::new();
    v.version = version.into();
    v.revision = revision.into();
    info.version = MessageField::some(v);
    if let Some(json) = features {
        let mut any = Any::new();
        any.type_url = FEATURES_TYPE.into();
        any.value = json;
        info.features = MessageField::some(any);
    }
    info
}

/// The OCI runtime's `features` JSON adjusted to corral: idmapped mounts enabled whatever the
/// runtime says (runc 1.1 has none; corral makes them) when `kernel_idmaps` says the kernel can
/// idmap every filesystem corral maps, and disabled otherwise. `None` if it is not a JSON object.
pub fn corral_features(runtime_features: &[u8], kernel_idmaps: bool) -> Option<Vec<u8>> {
    let mut doc: serde_json::Value = serde_json::from_slice(runtime_features).ok()?;
    let linux = doc.as_object_mut()?.entry("linux").or_insert_with(|| serde_json::json!({}));
    if let Some(linux) = linux.as_object_mut() {
        let ext = linux.entry("mountExtensions").or_insert_with(|| serde_json::json!({}));
        if let Some(ext) = ext.as_object_mut() {
            ext.insert("idmap".into(), serde_json::json!({ "enabled": kernel_idmaps }));
        }
    }
    serde_json::to_vec(&doc).ok()
}

/// Whether a kernel `release` (uname -r) idmaps every filesystem corral maps for a pod with a
/// user namespace: overlayfs lower layers (5.19) and the pod's shm on tmpfs (6.3), besides the
/// disk filesystems of pod files and volumes (ext4, xfs, btrfs: 5.12 to 5.15).
pub fn kernel_idmaps(release: &str) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 3)
}

/// Reads (and ignores) the runtime options containerd may send on stdin, then prints the info.
pub fn run(version: &str, revision: &str, runc: &std::path::Path) -> Result<()> {
    let mut options = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut options);
    let features = std::process::Command::new(runc)
        .arg("features")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            corral_features(&o.stdout, kernel_idmaps(&release))
        });
    let info = runtime_info(version, revision, features);
    let bytes = info.write_to_bytes().map_err(|e| Error::invalid(format!("encode RuntimeInfo: {e}")))?;
    std::io::stdout().write_all(&bytes).context(|| "write RuntimeInfo".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_carries_name_version_and_features() {
        let info = runtime_info("0.1.0", "abc123", Some(br#"{"ociVersionMin":"1.0.0"}"#.to_vec()));
        let back = RuntimeInfo::parse_from_bytes(&info.write_to_bytes().unwrap()).unwrap();
        assert_eq!(back.name, "io.containerd.corral.v2");
        assert_eq!((back.version.version.as_str(), back.version.revision.as_str()), ("0.1.0", "abc123"));
        assert_eq!(back.features.type_url, FEATURES_TYPE);
        assert!(runtime_info("0.1.0", "x", None).features.is_none());
    }

    #[test]
    fn features_keep_runc_mount_options_and_claim_idmapped_mounts() {
        // A runtime that says it has no idmapped mounts: corral makes them anyway.
        let runc = br#"{"ociVersionMin":"1.0.0","mountOptions":["ro","rro","rbind"],
            "linux":{"namespaces":["user","pid"],"mountExtensions":{"idmap":{"enabled":false}}}}"#;
        let ours: serde_json::Value = serde_json::from_slice(&corral_features(runc, true).unwrap()).unwrap();
        assert_eq!(ours["mountOptions"], serde_json::json!(["ro", "rro", "rbind"]));
        assert_eq!(ours["linux"]["namespaces"], serde_json::json!(["user", "pid"]));
        assert_eq!(ours["linux"]["mountExtensions"]["idmap"]["enabled"], true);
        // runc 1.1's shape has no mountExtensions: corral states it anyway.
        let old: serde_json::Value =
            serde_json::from_slice(&corral_features(br#"{"linux":{"namespaces":["user"]}}"#, true).unwrap())
                .unwrap();
        assert_eq!(old["linux"]["mountExtensions"]["idmap"]["enabled"], true);
        // A kernel that cannot idmap what corral maps: not claimed, whatever the runtime says.
        let enabled = br#"{"linux":{"mountExtensions":{"idmap":{"enabled":true}}}}"#;
        let ours: serde_json::Value =
            serde_json::from_slice(&corral_features(enabled, false).unwrap()).unwrap();
        assert_eq!(ours["linux"]["mountExtensions"]["idmap"]["enabled"], false);
        assert!(corral_features(b"not json", true).is_none());
        assert!(corral_features(b"[1]", true).is_none());
    }

    #[test]
    fn idmaps_need_a_kernel_that_maps_tmpfs() {
        for (release, ok) in [
            ("6.18.0-1-amd64", true),
            ("6.3.0", true),
            ("6.1.0-28-amd64", false),
            ("5.19.17", false),
            ("10.0", true),
            ("", false),
        ] {
            assert_eq!(kernel_idmaps(release), ok, "{release}");
        }
    }
}
