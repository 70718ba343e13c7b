//! What `start` reads on stdin and prints on stdout.
//!
//! stdin: containerd 2.1/2.2 send the runtime options as a protobuf `Any`, or nothing; 2.3+ send a
//! `BootstrapParams` message. The two share field numbers 1 and 2 on the wire, so a message is
//! taken as BootstrapParams only when its first field is this shim's id.
//! stdout: the JSON bootstrap with version 3 (accepted by every containerd from 2.0 on; 2.3+ also
//! accept a protobuf reply, which corral does not need).

use containerd_shim_protos::bootstrap_api::BootstrapParams;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::Message;

use crate::error::{Error, Result};

#[derive(Debug, Default, PartialEq)]
pub struct StartInput {
    /// 2.3+: where containerd wants shim sockets.
    pub socket_dir: Option<String>,
    /// The runtime options (type URL, value), when containerd sent some.
    pub options: Option<(String, Vec<u8>)>,
}

pub fn parse_stdin(data: &[u8], id: &str) -> Result<StartInput> {
    if data.is_empty() {
        return Ok(StartInput::default());
    }
    if let Ok(params) = BootstrapParams::parse_from_bytes(data) {
        if params.instance_id == id {
            // The handler's options are one of the extensions.
            let options = params
                .extensions
                .iter()
                .filter_map(|e| e.value.as_ref())
                .find(|a| a.type_url.ends_with("runtimeoptions.v1.Options"))
                .map(|a| (a.type_url.clone(), a.value.clone()));
            return Ok(StartInput { socket_dir: params.socket_dir.clone(), options });
        }
    }
    let any = Any::parse_from_bytes(data)
        .map_err(|e| Error::invalid(format!("stdin: neither runtime options nor BootstrapParams: {e}")))?;
    Ok(StartInput { socket_dir: None, options: Some((any.type_url, any.value)) })
}

/// The reply containerd parses from `start`'s output.
pub fn reply_json(socket: &std::path::Path) -> String {
    serde_json::json!({
        "version": containerd_shim_protos::TASK_API_VERSION,
        "address": format!("unix://{}", socket.display()),
        "protocol": "ttrpc",
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_containerd_stdin_format() {
        assert_eq!(parse_stdin(&[], "sb").unwrap(), StartInput::default());

        let mut any = Any::new();
        any.type_url = "runtimeoptions.v1.Options".into();
        any.value = vec![10, 1, b'x'];
        let got = parse_stdin(&any.write_to_bytes().unwrap(), "sb").unwrap();
        assert_eq!(got.options, Some(("runtimeoptions.v1.Options".to_string(), vec![10, 1, b'x'])));
        assert_eq!(got.socket_dir, None);

        let mut params = BootstrapParams::new();
        params.instance_id = "sb".into();
        params.namespace = "k8s.io".into();
        params.socket_dir = Some("/run/containerd/s".into());
        let got = parse_stdin(&params.write_to_bytes().unwrap(), "sb").unwrap();
        assert_eq!(got.socket_dir.as_deref(), Some("/run/containerd/s"));
        assert_eq!(got.options, None);
        // 2.3+: the handler's options come as an extension.
        let mut ext = containerd_shim_protos::bootstrap_api::Extension::new();
        ext.value = containerd_shim_protos::protobuf::MessageField::some(any.clone());
        params.extensions.push(ext);
        let got = parse_stdin(&params.write_to_bytes().unwrap(), "sb").unwrap();
        assert_eq!(got.options, Some((any.type_url.clone(), any.value.clone())));

        assert!(parse_stdin(&[0xff, 0xff], "sb").unwrap_err().to_string().starts_with("stdin:"));
    }

    #[test]
    fn replies_version_3_json() {
        let v: serde_json::Value =
            serde_json::from_str(&reply_json(std::path::Path::new("/run/corral/s/ab"))).unwrap();
        assert_eq!(v["version"], 3);
        assert_eq!(v["address"], "unix:///run/corral/s/ab");
        assert_eq!(v["protocol"], "ttrpc");
    }
}
