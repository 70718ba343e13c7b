//! Rewriting a container's `config.json` so it lives in its pod.
//!
//! CRI (shim mode) writes namespace paths `/proc/<sandbox pid>/ns/*` and no pod files. corral points
//! the namespaces at its pins and adds the pod's hostname, hosts, resolv.conf and /dev/shm as bind
//! mounts, unless the container already mounts something at that path. In a pod with its own
//! user namespace those mounts carry the container's id mappings, as CRI gives its own pod files,
//! so that they are idmapped ([`super::idmap`]) and owned by the container's root.
//!
//! The spec is edited as a JSON tree, not through typed OCI structs, so fields corral does not
//! know (newer runtime-spec fields, vendor annotations) pass through untouched.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// What a container needs from its pod.
#[derive(Clone, Debug, Default)]
pub struct PodContext {
    /// The pid CRI put in the namespace paths.
    pub sandbox_pid: i32,
    /// /proc ns name ("net", "ipc", "uts", "pid") -> pin file.
    pub pins: HashMap<String, PathBuf>,
    pub hostname: PathBuf,
    pub hosts: PathBuf,
    pub resolv_conf: PathBuf,
    /// The pod's shm; with hostIPC the node's /dev/shm.
    pub shm: PathBuf,
}

/// OCI namespace type -> the file name under /proc/<pid>/ns.
fn proc_ns_name(oci_type: &str) -> Option<&'static str> {
    Some(match oci_type {
        "network" => "net",
        "ipc" => "ipc",
        "uts" => "uts",
        "pid" => "pid",
        "user" => "user",
        "cgroup" => "cgroup",
        "mount" => "mnt",
        _ => return None,
    })
}

/// Rewrites `spec` in place. Errors name the offending JSON field.
pub fn rewrite(spec: &mut Value, pod: &PodContext) -> Result<()> {
    let obj = spec.as_object_mut().ok_or_else(|| Error::invalid("config.json: not a JSON object"))?;
    let readonly_root =
        obj.get("root").and_then(|r| r.get("readonly")).and_then(Value::as_bool).unwrap_or(false);

    if let Some(namespaces) = obj.get_mut("linux").and_then(|l| l.get_mut("namespaces")) {
        let list = namespaces
            .as_array_mut()
            .ok_or_else(|| Error::invalid("config.json: linux.namespaces is not an array"))?;
        for (i, ns) in list.iter_mut().enumerate() {
            rewrite_namespace(ns, pod)
                .map_err(|why| Error::invalid(format!("config.json: linux.namespaces[{i}]: {why}")))?;
        }
    }

    refuse_hostname_in_a_joined_uts(obj)?;

    let idmapping = pod_mount_idmapping(obj);
    let mounts = obj.entry("mounts").or_insert_with(|| json!([]));
    let mounts =
        mounts.as_array_mut().ok_or_else(|| Error::invalid("config.json: mounts is not an array"))?;
    for (i, m) in mounts.iter().enumerate() {
        if !m.get("destination").is_some_and(Value::is_string) {
            return Err(Error::invalid(format!(
                "config.json: mounts[{i}].destination: missing or not a string"
            )));
        }
    }
    let file_mode = if readonly_root { "ro" } else { "rw" };
    for (dest, source) in
        [("/etc/hostname", &pod.hostname), ("/etc/hosts", &pod.hosts), ("/etc/resolv.conf", &pod.resolv_conf)]
    {
        if position(mounts, dest).is_none() {
            mounts.push(bind(dest, source, file_mode, idmapping.as_ref()));
        }
    }
    // The pod's shm replaces the per-container tmpfs CRI adds; a volume the user mounted at
    // /dev/shm stays.
    let shm = bind("/dev/shm", &pod.shm, "rw", idmapping.as_ref());
    match position(mounts, "/dev/shm") {
        Some(i) if is_default_shm(&mounts[i]) => mounts[i] = shm,
        Some(_) => {}
        None => mounts.push(shm),
    }
    Ok(())
}

/// A hostname (or NIS domain name) in the spec is set by the runtime in the container's UTS
/// namespace, even one it joins: the pod's, whose name is the pod's hostname, or, with no UTS
/// namespace of its own or the pod's (hostNetwork), the node's. CRI sets none for Linux
/// containers; corral refuses one unless the container has a UTS namespace of its own, so that
/// no container renames its pod or the node.
fn refuse_hostname_in_a_joined_uts(spec: &serde_json::Map<String, Value>) -> Result<()> {
    let namespaces = spec.get("linux").and_then(|l| l.get("namespaces")).and_then(Value::as_array);
    let own_uts = namespaces
        .into_iter()
        .flatten()
        .any(|ns| ns["type"] == "uts" && ns.get("path").and_then(Value::as_str).is_none_or(str::is_empty));
    for field in ["hostname", "domainname"] {
        let name = spec.get(field).and_then(Value::as_str).unwrap_or_default();
        if !name.is_empty() && !own_uts {
            return Err(Error::invalid(format!(
                "config.json: {field}: {name:?} would rename the UTS namespace the container joins \
                 (its pod's, or the node's for a hostNetwork pod); a container may set one only in \
                 a UTS namespace of its own"
            )));
        }
    }
    Ok(())
}

/// Whether the container's processes live in a pid namespace it does not own (the pod's, another
/// container's, or the node's): then its init's exit does not end them.
pub fn shares_pid_namespace(spec: &Value) -> bool {
    let namespaces = spec.pointer("/linux/namespaces").and_then(Value::as_array);
    match namespaces.and_then(|list| list.iter().find(|ns| ns["type"] == "pid")) {
        None => true,
        Some(ns) => ns.get("path").and_then(Value::as_str).is_some_and(|p| !p.is_empty()),
    }
}

/// Whether the spec has `hooks.poststart`: the runtime's own `start` runs them (runc 1.1 at
/// create already, libcontainer at start), so corral then leaves the start to the runtime.
pub fn has_poststart_hooks(spec: &Value) -> bool {
    spec.pointer("/hooks/poststart").and_then(Value::as_array).is_some_and(|hooks| !hooks.is_empty())
}

/// The `terminal` flag of the spec's process.
pub fn wants_terminal(process: &Value) -> bool {
    process.get("terminal").and_then(Value::as_bool).unwrap_or(false)
}

fn rewrite_namespace(ns: &mut Value, pod: &PodContext) -> std::result::Result<(), String> {
    let Some(path) = ns.get("path").and_then(Value::as_str) else {
        return Ok(());
    };
    let kind = ns.get("type").and_then(Value::as_str).ok_or("type: missing or not a string")?;
    let name = proc_ns_name(kind).ok_or_else(|| format!("type: unknown namespace type {kind:?}"))?;
    // Only the sandbox's own paths are rewritten; TARGET mode points at another container's init
    // and must stay.
    let ours = [pod.sandbox_pid, 0].iter().any(|pid| path == format!("/proc/{pid}/ns/{name}"));
    if !ours {
        return Ok(());
    }
    let new_path = match pod.pins.get(name) {
        Some(pin) => pin.display().to_string(),
        None if pod.sandbox_pid > 0 => format!("/proc/{}/ns/{name}", pod.sandbox_pid),
        None => return Err(format!("path {path:?}: the pod has no {name} namespace")),
    };
    ns["path"] = Value::String(new_path);
    Ok(())
}

fn position(mounts: &[Value], destination: &str) -> Option<usize> {
    let clean = |p: &str| p.trim_end_matches('/').to_string();
    mounts
        .iter()
        .position(|m| m.get("destination").and_then(Value::as_str).map(clean).as_deref() == Some(destination))
}

fn is_default_shm(m: &Value) -> bool {
    m.get("type").and_then(Value::as_str) == Some("tmpfs")
        && m.get("source").and_then(Value::as_str) == Some("shm")
}

/// The container's (uidMappings, gidMappings) when it joins a user namespace with mappings.
fn pod_mount_idmapping(spec: &serde_json::Map<String, Value>) -> Option<(Value, Value)> {
    let linux = spec.get("linux")?;
    let namespaces = linux.get("namespaces").and_then(Value::as_array)?;
    // Only a user namespace that exists (the pod's, by path): one runc creates for the container
    // does not exist yet when corral prepares the idmapped copies.
    let joined = |ns: &Value| ns["type"] == "user" && ns["path"].as_str().is_some_and(|p| !p.is_empty());
    if !namespaces.iter().any(joined) {
        return None;
    }
    let non_empty =
        |key: &str| linux.get(key).filter(|v| v.as_array().is_some_and(|a| !a.is_empty())).cloned();
    Some((non_empty("uidMappings")?, non_empty("gidMappings")?))
}

fn bind(destination: &str, source: &Path, mode: &str, idmapping: Option<&(Value, Value)>) -> Value {
    let mut m = json!({
        "destination": destination,
        "type": "bind",
        "source": source.display().to_string(),
        "options": ["rbind", "rprivate", mode],
    });
    if let Some((uids, gids)) = idmapping {
        m["uidMappings"] = uids.clone();
        m["gidMappings"] = gids.clone();
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodContext {
        PodContext {
            sandbox_pid: 4242,
            pins: HashMap::from([
                ("net".to_string(), PathBuf::from("/b/rootfs/ns/net")),
                ("ipc".to_string(), PathBuf::from("/b/rootfs/ns/ipc")),
                ("uts".to_string(), PathBuf::from("/b/rootfs/ns/uts")),
            ]),
            hostname: "/b/pod/hostname".into(),
            hosts: "/b/pod/hosts".into(),
            resolv_conf: "/b/pod/resolv.conf".into(),
            shm: "/b/rootfs/shm".into(),
        }
    }

    /// The shape CRI 2.1.9 writes (trimmed), with a field corral does not know.
    fn cri_spec() -> Value {
        json!({
            "ociVersion": "1.2.0",
            "root": {"path": "rootfs"},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                 "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
                {"destination": "/etc/hosts", "type": "bind", "source": "/kubelet/etc-hosts",
                 "options": ["rbind", "rprivate", "rw"]}
            ],
            "linux": {
                "namespaces": [
                    {"type": "pid"},
                    {"type": "ipc", "path": "/proc/4242/ns/ipc"},
                    {"type": "uts", "path": "/proc/4242/ns/uts"},
                    {"type": "mount"},
                    {"type": "network", "path": "/proc/4242/ns/net"}
                ],
                "futureField": {"x": 1}
            },
            "vendorExtension": [1, 2, 3]
        })
    }

    fn ns_path(spec: &Value, kind: &str) -> Option<String> {
        spec["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["type"] == kind)
            .and_then(|n| n["path"].as_str().map(String::from))
    }

    fn mount_at<'a>(spec: &'a Value, dest: &str) -> Vec<&'a Value> {
        spec["mounts"].as_array().unwrap().iter().filter(|m| m["destination"] == dest).collect()
    }

    #[test]
    fn points_namespaces_at_the_pins_and_keeps_fresh_ones() {
        let mut spec = cri_spec();
        rewrite(&mut spec, &pod()).unwrap();
        assert_eq!(ns_path(&spec, "network").as_deref(), Some("/b/rootfs/ns/net"));
        assert_eq!(ns_path(&spec, "ipc").as_deref(), Some("/b/rootfs/ns/ipc"));
        assert_eq!(ns_path(&spec, "uts").as_deref(), Some("/b/rootfs/ns/uts"));
        assert_eq!(ns_path(&spec, "pid"), None, "kubelet's default: a fresh pid namespace");
    }

    #[test]
    fn adds_pod_files_and_replaces_the_default_shm() {
        let mut spec = cri_spec();
        rewrite(&mut spec, &pod()).unwrap();
        let hostname = mount_at(&spec, "/etc/hostname");
        assert_eq!(hostname.len(), 1);
        assert_eq!(hostname[0]["source"], "/b/pod/hostname");
        assert_eq!(hostname[0]["options"], json!(["rbind", "rprivate", "rw"]));
        assert_eq!(mount_at(&spec, "/etc/resolv.conf")[0]["source"], "/b/pod/resolv.conf");
        // kubelet's /etc/hosts stays.
        let hosts = mount_at(&spec, "/etc/hosts");
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0]["source"], "/kubelet/etc-hosts");
        let shm = mount_at(&spec, "/dev/shm");
        assert_eq!(shm.len(), 1);
        assert_eq!(shm[0]["type"], "bind");
        assert_eq!(shm[0]["source"], "/b/rootfs/shm");
    }

    #[test]
    fn keeps_unknown_fields_and_a_user_shm_volume() {
        let mut spec = cri_spec();
        spec["mounts"][1] = json!({"destination": "/dev/shm/", "type": "bind", "source": "/vol"});
        rewrite(&mut spec, &pod()).unwrap();
        assert_eq!(spec["vendorExtension"], json!([1, 2, 3]));
        assert_eq!(spec["linux"]["futureField"], json!({"x": 1}));
        assert_eq!(spec["mounts"][1]["source"], "/vol");
    }

    #[test]
    fn readonly_root_gets_readonly_pod_files() {
        let mut spec = cri_spec();
        spec["root"]["readonly"] = json!(true);
        rewrite(&mut spec, &pod()).unwrap();
        assert_eq!(mount_at(&spec, "/etc/hostname")[0]["options"][2], "ro");
        assert_eq!(mount_at(&spec, "/dev/shm")[0]["options"][2], "rw");
    }

    #[test]
    fn pid_zero_paths_and_pod_pid_namespace() {
        let mut spec = cri_spec();
        spec["linux"]["namespaces"][0] = json!({"type": "pid", "path": "/proc/0/ns/pid"});
        spec["linux"]["namespaces"][4] = json!({"type": "network", "path": "/proc/0/ns/net"});
        rewrite(&mut spec, &pod()).unwrap();
        assert_eq!(ns_path(&spec, "network").as_deref(), Some("/b/rootfs/ns/net"));
        // No pin for pid: the holder's own path.
        assert_eq!(ns_path(&spec, "pid").as_deref(), Some("/proc/4242/ns/pid"));
    }

    #[test]
    fn tells_a_shared_pid_namespace() {
        let mut spec = cri_spec();
        assert!(!shares_pid_namespace(&spec));
        spec["linux"]["namespaces"][0] = json!({"type": "pid", "path": "/proc/777/ns/pid"});
        assert!(shares_pid_namespace(&spec));
        spec["linux"]["namespaces"].as_array_mut().unwrap().remove(0);
        assert!(shares_pid_namespace(&spec), "no pid namespace: the node's");
    }

    #[test]
    fn tells_poststart_hooks() {
        let mut spec = cri_spec();
        assert!(!has_poststart_hooks(&spec));
        for (hooks, want) in [
            (json!({}), false),
            (json!({"poststart": []}), false),
            (json!({"prestart": [{"path": "/bin/true"}]}), false),
            (json!({"poststart": [{"path": "/bin/true"}]}), true),
        ] {
            spec["hooks"] = hooks.clone();
            assert_eq!(has_poststart_hooks(&spec), want, "{hooks}");
        }
    }

    #[test]
    fn leaves_other_containers_namespaces_alone() {
        let mut spec = cri_spec();
        spec["linux"]["namespaces"][0] = json!({"type": "pid", "path": "/proc/777/ns/pid"});
        rewrite(&mut spec, &pod()).unwrap();
        assert_eq!(ns_path(&spec, "pid").as_deref(), Some("/proc/777/ns/pid"));
    }

    #[test]
    fn pod_mounts_carry_the_user_namespace_mappings() {
        let mut spec = cri_spec();
        let map = json!([{"containerID": 0, "hostID": 196608, "size": 65536}]);
        spec["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "user", "path": "/proc/4242/ns/user"}));
        spec["linux"]["uidMappings"] = map.clone();
        spec["linux"]["gidMappings"] = map.clone();
        rewrite(&mut spec, &pod()).unwrap();
        for dest in ["/etc/hostname", "/etc/resolv.conf", "/dev/shm"] {
            let m = mount_at(&spec, dest)[0];
            assert_eq!(m["uidMappings"], map, "{dest}");
            assert_eq!(m["gidMappings"], map, "{dest}");
        }
        // The container's own /etc/hosts is left as CRI wrote it.
        assert!(mount_at(&spec, "/etc/hosts")[0].get("uidMappings").is_none());
        // Without a user namespace: no mappings.
        let mut spec = cri_spec();
        rewrite(&mut spec, &pod()).unwrap();
        assert!(mount_at(&spec, "/dev/shm")[0].get("uidMappings").is_none());
    }

    #[test]
    fn a_hostname_is_refused_unless_the_container_has_its_own_uts_namespace() {
        let with = |hostname: &str, uts: Option<Value>| {
            let mut spec = cri_spec();
            spec["hostname"] = json!(hostname);
            let list = spec["linux"]["namespaces"].as_array_mut().unwrap();
            list.retain(|ns| ns["type"] != "uts");
            list.extend(uts);
            rewrite(&mut spec, &pod())
        };
        let joined = || Some(json!({"type": "uts", "path": "/proc/4242/ns/uts"}));
        let err = with("renamed", joined()).unwrap_err().to_string();
        assert!(err.contains("config.json: hostname: \"renamed\""), "{err}");
        let err = with("renamed", None).unwrap_err().to_string();
        assert!(err.contains("config.json: hostname"), "no uts entry is the node's: {err}");
        with("renamed", Some(json!({"type": "uts"}))).expect("its own UTS namespace");
        with("", joined()).expect("no hostname");

        let mut spec = cri_spec();
        spec["domainname"] = json!("example.org");
        let err = rewrite(&mut spec, &pod()).unwrap_err().to_string();
        assert!(err.contains("config.json: domainname"), "{err}");
    }

    #[test]
    fn refuses_malformed_specs_naming_the_field() {
        let err = |mut v: Value| rewrite(&mut v, &pod()).unwrap_err().to_string();
        assert_eq!(err(json!([])), "config.json: not a JSON object");
        assert_eq!(err(json!({"mounts": {}})), "config.json: mounts is not an array");
        assert!(err(json!({"mounts": [{"type": "bind"}]})).contains("mounts[0].destination"));
        assert!(err(json!({"linux": {"namespaces": 3}})).contains("linux.namespaces is not an array"));
        assert!(err(json!({"linux": {"namespaces": [{"type": "bogus", "path": "/proc/4242/ns/x"}]}}))
            .contains("linux.namespaces[0]: type: unknown namespace type \"bogus\""));
    }
}
