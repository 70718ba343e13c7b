//! `-info`: containerd asks a shim what its runtime supports (2.1 only for idmapped mounts, 2.4
//! for every handler at start-up). corral answers a `RuntimeInfo` with its name and version and
//! the OCI runtime's own `features` document, so containerd sees what runc can do.

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

/// Reads (and ignores) the runtime options containerd may send on stdin, then prints the info.
pub fn run(version: &str, revision: &str, runc: &str) -> Result<()> {
    let mut options = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut options);
    let features = std::process::Command::new(runc)
        .arg("features")
        .output()
        .ok()
        .filter(|o| o.status.success() && serde_json::from_slice::<serde_json::Value>(&o.stdout).is_ok())
        .map(|o| o.stdout);
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
}
