//! The command line exactly as containerd passes it (Go `flag` syntax: `-name value`,
//! `-name=value`, `--name value`; boolean flags alone), then the action word.

use std::path::PathBuf;

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Start,
    Delete,
    /// Internal: the long-running server `start` spawns for one pod.
    Serve,
    /// Internal: node mode's one server for every pod (no `-id`: it belongs to no pod).
    ServeNode,
    /// Checks a node's setup for corral.
    Doctor,
    Version,
    Info,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub action: Action,
    pub namespace: String,
    pub address: String,
    pub publish_binary: String,
    pub id: String,
    pub bundle: Option<PathBuf>,
    pub debug: bool,
    /// Internal (serve): the socket path to remove on exit.
    pub socket: Option<PathBuf>,
    /// doctor: containerd's config file.
    pub containerd_config: Option<PathBuf>,
}

impl Args {
    pub fn parse<S: AsRef<str>>(argv: &[S]) -> Result<Args> {
        let mut args = Args {
            action: Action::Start,
            namespace: String::new(),
            address: String::new(),
            publish_binary: String::new(),
            id: String::new(),
            bundle: None,
            debug: false,
            socket: None,
            containerd_config: None,
        };
        let mut action = None;
        let mut it = argv.iter().map(AsRef::as_ref);
        while let Some(arg) = it.next() {
            let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
                if action.is_some() {
                    return Err(Error::invalid(format!("unexpected argument {arg:?}")));
                }
                action = Some(match arg {
                    "start" => Action::Start,
                    "delete" => Action::Delete,
                    "serve" => Action::Serve,
                    "serve-node" => Action::ServeNode,
                    "doctor" => Action::Doctor,
                    other => return Err(Error::invalid(format!("unknown action {other:?} (start, delete)"))),
                });
                continue;
            };
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (flag, None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next().map(str::to_string))
                    .ok_or_else(|| Error::invalid(format!("flag -{name} needs a value")))
            };
            match name {
                "namespace" => args.namespace = value()?,
                "address" => args.address = value()?,
                "publish-binary" => args.publish_binary = value()?,
                "id" => args.id = value()?,
                "bundle" => args.bundle = Some(PathBuf::from(value()?)),
                "socket" => args.socket = Some(PathBuf::from(value()?)),
                "containerd-config" => args.containerd_config = Some(PathBuf::from(value()?)),
                "debug" => args.debug = inline.as_deref() != Some("false"),
                "v" | "version" => action = action.or(Some(Action::Version)),
                "info" => action = action.or(Some(Action::Info)),
                other => return Err(Error::invalid(format!("unknown flag -{other}"))),
            }
        }
        args.action = action.ok_or_else(|| Error::invalid("missing action (start or delete)"))?;
        if matches!(args.action, Action::Start | Action::Delete | Action::Serve) {
            if args.namespace.is_empty() {
                return Err(Error::invalid("flag -namespace: required"));
            }
            if args.id.is_empty() {
                return Err(Error::invalid("flag -id: required"));
            }
            crate::ids::validate("flag -id", &args.id)?;
        }
        if args.action == Action::ServeNode && (args.namespace.is_empty() || args.socket.is_none()) {
            return Err(Error::invalid("serve-node: flags -namespace and -socket are required"));
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_containerd_start_and_delete_lines() {
        let a = Args::parse(&[
            "-namespace",
            "k8s.io",
            "-address",
            "/run/c.sock",
            "-publish-binary",
            "/usr/bin/containerd",
            "-id",
            "abc",
            "-debug",
            "start",
        ])
        .unwrap();
        assert_eq!(a.action, Action::Start);
        assert_eq!(
            (a.namespace.as_str(), a.address.as_str(), a.id.as_str()),
            ("k8s.io", "/run/c.sock", "abc")
        );
        assert!(a.debug);

        let a = Args::parse(&["--namespace=k8s.io", "-id", "c1", "-bundle", "/b/c1", "delete"]).unwrap();
        assert_eq!(a.action, Action::Delete);
        assert_eq!(a.bundle, Some(PathBuf::from("/b/c1")));
        assert!(!a.debug);
        assert_eq!(Args::parse(&["-v"]).unwrap().action, Action::Version);
    }

    #[test]
    fn refuses_bad_lines() {
        let err = |v: &[&str]| Args::parse(v).unwrap_err().to_string();
        assert_eq!(err(&["-namespace", "n", "-id", "x", "frob"]), "unknown action \"frob\" (start, delete)");
        assert_eq!(err(&["-namespace", "n", "-id", "x", "-color", "start"]), "unknown flag -color");
        assert_eq!(err(&["-namespace", "n", "start"]), "flag -id: required");
        assert_eq!(
            err(&["-namespace", "n", "-id", "../x", "start"]),
            "flag -id: \"../x\" is not a valid id (1-128 of [A-Za-z0-9_.-])"
        );
        assert_eq!(err(&["-namespace", "n", "-id"]), "flag -id needs a value");
    }
}
