//! What corral-oci checks and changes in a bundle's config.json before libcontainer sees it.

use std::path::Path;

use libcontainer::oci_spec::runtime::LinuxDeviceCgroup;
use serde_json::Value;

pub fn read(bundle: &Path) -> Result<Value, String> {
    let path = bundle.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))
}

/// Refuses what libcontainer 0.7 would silently get wrong, naming the field:
/// - SELinux labels: it ignores them (the container would run unconfined);
/// - systemd's cgroup driver on a cgroup v1 (or hybrid) node: it falls back to its v1
///   cgroupfs manager, which would take a `slice:prefix:name` path for a directory.
pub fn refuse_unsupported(spec: &Value, systemd_cgroup: bool, cgroup_v2: bool) -> Result<(), String> {
    for (pointer, field) in
        [("/process/selinuxLabel", "process.selinuxLabel"), ("/linux/mountLabel", "linux.mountLabel")]
    {
        if spec.pointer(pointer).and_then(Value::as_str).is_some_and(|l| !l.is_empty()) {
            return Err(format!(
                "config.json: {field}: SELinux labels are not supported by the builtin runtime"
            ));
        }
    }
    if systemd_cgroup && !cgroup_v2 {
        return Err(
            "--systemd-cgroup: the builtin runtime supports systemd's cgroup driver on cgroup v2 only".into(),
        );
    }
    Ok(())
}

/// The spec's device cgroup rules (`linux.resources.devices`), for the device program corral-oci
/// attaches itself under systemd's driver on cgroup v2.
pub fn device_rules(spec: &Value) -> Result<Option<Vec<LinuxDeviceCgroup>>, String> {
    let Some(rules) = spec.pointer("/linux/resources/devices").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    serde_json::from_value(rules.clone())
        .map(Some)
        .map_err(|e| format!("config.json: linux.resources.devices: {e}"))
}

/// Whether the container joins an existing user namespace (a path: the pod's).
pub fn joins_user_namespace(spec: &Value) -> bool {
    let namespaces = spec.pointer("/linux/namespaces").and_then(Value::as_array);
    namespaces.is_some_and(|nss| {
        nss.iter().any(|ns| ns["type"] == "user" && ns["path"].as_str().is_some_and(|p| !p.is_empty()))
    })
}

/// Points every namespace path but the user namespace's at `/proc/self/fd/<fd>`, the fd that
/// `open(kind, path)` returns for it, and makes a relative root absolute against `bundle`.
pub fn name_namespaces_by_fd(
    spec: &mut Value,
    bundle: &Path,
    mut open: impl FnMut(&str, &str) -> Result<i32, String>,
) -> Result<(), String> {
    let namespaces = spec.pointer_mut("/linux/namespaces").and_then(Value::as_array_mut);
    for ns in namespaces.into_iter().flatten() {
        let kind = ns["type"].as_str().unwrap_or_default().to_string();
        let Some(path) = ns["path"].as_str().filter(|p| !p.is_empty() && kind != "user") else { continue };
        let fd = open(&kind, path)?;
        ns["path"] = format!("/proc/self/fd/{fd}").into();
    }
    let root = spec.pointer("/root/path").and_then(Value::as_str).map(Path::new).filter(|r| r.is_relative());
    if let Some(absolute) = root.map(|r| bundle.join(r).display().to_string()) {
        spec["root"]["path"] = absolute.into();
    }
    Ok(())
}

/// The spec an exec'd process is made from: the container's own spec with the exec's `process`,
/// and a `linux` section that joins every namespace of the running init (`/proc/<pid>/ns/*`,
/// the user namespace included) and keeps what applies to each of the container's processes:
/// its cgroup, seccomp profile, personality and time offsets. What made the container once
/// (hostname, hooks, mounts' and devices' setup, resources, sysctls) is dropped.
///
/// libcontainer 0.7's own exec keeps the namespaces but `user`, and none of `linux` but the
/// cgroup path, personality and time offsets: its processes would run outside the container's
/// user namespace and without its seccomp filter, both of which runc's exec applies.
pub fn for_exec(container: &Value, process: Value, init_pid: i32) -> Result<Value, String> {
    let linux = container.get("linux").ok_or("the container's config.json has no linux section")?;
    let mut namespaces = Vec::new();
    for ns in linux["namespaces"].as_array().into_iter().flatten() {
        let kind = ns["type"].as_str().unwrap_or_default();
        let file = match kind {
            "network" => "net",
            "mount" => "mnt",
            "pid" | "ipc" | "uts" | "user" | "cgroup" | "time" => kind,
            other => {
                return Err(format!("the container's config.json: linux.namespaces: unknown type {other:?}"))
            }
        };
        namespaces.push(serde_json::json!({"type": kind, "path": format!("/proc/{init_pid}/ns/{file}")}));
    }
    let mut joined = serde_json::json!({ "namespaces": namespaces });
    for key in ["cgroupsPath", "seccomp", "personality", "timeOffsets"] {
        if let Some(value) = linux.get(key).filter(|v| !v.is_null()) {
            joined[key] = value.clone();
        }
    }
    let mut spec = container.clone();
    let object = spec.as_object_mut().ok_or("the container's config.json is not an object")?;
    for made_once in ["hostname", "domainname", "hooks"] {
        object.remove(made_once);
    }
    object.insert("process".into(), process);
    object.insert("linux".into(), joined);
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn refusals_name_the_field() {
        let base = json!({"process": {"args": ["sh"]}, "linux": {}});
        let cases = [
            (
                json!({"process": {"selinuxLabel": "system_u:system_r:container_t:s0"}}),
                false,
                true,
                Some("process.selinuxLabel"),
            ),
            (
                json!({"linux": {"mountLabel": "system_u:object_r:container_file_t:s0"}}),
                false,
                true,
                Some("linux.mountLabel"),
            ),
            (json!({"process": {"selinuxLabel": ""}, "linux": {"mountLabel": ""}}), false, false, None),
            (base.clone(), true, false, Some("--systemd-cgroup")),
            (base.clone(), true, true, None),
            (base.clone(), false, false, None),
        ];
        for (spec, systemd, v2, refused) in cases {
            match (refuse_unsupported(&spec, systemd, v2), refused) {
                (Ok(()), None) => {}
                (Err(e), Some(field)) => assert!(e.contains(field), "{spec}: {e}"),
                (other, _) => panic!("{spec} systemd={systemd} v2={v2}: {other:?}"),
            }
        }
    }

    #[test]
    fn device_rules_are_read_or_named() {
        assert!(device_rules(&json!({"linux": {}})).unwrap().is_none());
        assert!(device_rules(&json!({"linux": {"resources": {"devices": null}}})).unwrap().is_none());
        let rules = json!({"linux": {"resources": {"devices": [
            {"allow": false, "access": "rwm"},
            {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"},
        ]}}});
        let rules = device_rules(&rules).unwrap().unwrap();
        assert_eq!(rules.len(), 2);
        assert!(!rules[0].allow() && rules[1].allow());
        assert_eq!(rules[1].major(), Some(1));
        let err =
            device_rules(&json!({"linux": {"resources": {"devices": [{"allow": "yes"}]}}})).unwrap_err();
        assert!(err.starts_with("config.json: linux.resources.devices: "), "{err}");
    }

    #[test]
    fn joining_a_user_namespace_needs_its_path() {
        let with = |ns: Value| json!({"linux": {"namespaces": ns}});
        assert!(joins_user_namespace(&with(json!([{"type": "user", "path": "/proc/1/ns/user"}]))));
        assert!(!joins_user_namespace(&with(json!([{"type": "user"}]))), "a new one is not joined");
        assert!(!joins_user_namespace(&with(json!([{"type": "user", "path": ""}]))));
        assert!(!joins_user_namespace(&with(json!([{"type": "network", "path": "/x"}]))));
        assert!(!joins_user_namespace(&json!({})));
    }

    #[test]
    fn namespaces_but_user_are_named_by_fd_and_the_root_made_absolute() {
        let mut spec = json!({
            "root": {"path": "rootfs"},
            "linux": {"namespaces": [
                {"type": "user", "path": "/pins/user"},
                {"type": "network", "path": "/pins/net"},
                {"type": "mount"},
                {"type": "ipc", "path": "/pins/ipc"},
            ]},
        });
        let mut opened = Vec::new();
        name_namespaces_by_fd(&mut spec, Path::new("/b"), |kind, path| {
            opened.push(format!("{kind}={path}"));
            Ok(10 + opened.len() as i32)
        })
        .unwrap();
        assert_eq!(opened, ["network=/pins/net", "ipc=/pins/ipc"]);
        let paths: Vec<_> =
            spec["linux"]["namespaces"].as_array().unwrap().iter().map(|n| n["path"].clone()).collect();
        assert_eq!(
            paths,
            [json!("/pins/user"), json!("/proc/self/fd/11"), Value::Null, json!("/proc/self/fd/12")]
        );
        assert_eq!(spec["root"]["path"], "/b/rootfs");

        let mut absolute =
            json!({"root": {"path": "/r"}, "linux": {"namespaces": [{"type": "ipc", "path": "/gone"}]}});
        let err =
            name_namespaces_by_fd(&mut absolute, Path::new("/b"), |_, p| Err(format!("open {p}: ENOENT")));
        assert_eq!(err.unwrap_err(), "open /gone: ENOENT");
    }

    #[test]
    fn an_exec_joins_every_namespace_of_the_init_and_keeps_its_confinement() {
        let container = json!({
            "ociVersion": "1.2.0",
            "hostname": "pod",
            "hooks": {"poststart": []},
            "root": {"path": "/r"},
            "process": {"args": ["sleep", "1000"]},
            "mounts": [{"destination": "/proc", "type": "proc"}],
            "linux": {
                "namespaces": [
                    {"type": "user", "path": "/pins/user"}, {"type": "network", "path": "/pins/net"},
                    {"type": "mount"}, {"type": "pid"}, {"type": "ipc"}, {"type": "uts"},
                    {"type": "cgroup"},
                ],
                "cgroupsPath": "/k8s.io/c1",
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO"},
                "personality": null,
                "maskedPaths": ["/proc/keys"],
                "sysctl": {"net.ipv4.ip_forward": "1"},
                "resources": {"memory": {"limit": 1}},
            },
        });
        let exec = for_exec(&container, json!({"args": ["sh"]}), 42).unwrap();
        assert_eq!(exec["process"], json!({"args": ["sh"]}));
        assert_eq!(exec["root"], container["root"]);
        assert_eq!(exec["mounts"], container["mounts"], "kept: libcontainer makes no rootfs for an exec");
        assert!(exec.get("hostname").is_none() && exec.get("hooks").is_none());
        let kinds = ["user", "network", "mount", "pid", "ipc", "uts", "cgroup"];
        let files = ["user", "net", "mnt", "pid", "ipc", "uts", "cgroup"];
        let expected: Vec<_> = kinds
            .iter()
            .zip(files)
            .map(|(k, f)| json!({"type": k, "path": format!("/proc/42/ns/{f}")}))
            .collect();
        assert_eq!(
            exec["linux"],
            json!({
                "namespaces": expected,
                "cgroupsPath": "/k8s.io/c1",
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO"},
            }),
            "masked paths, sysctls and resources were the init's setup; a null personality is left out"
        );

        let odd = json!({"linux": {"namespaces": [{"type": "net"}]}});
        assert_eq!(
            for_exec(&odd, json!({}), 1).unwrap_err(),
            "the container's config.json: linux.namespaces: unknown type \"net\""
        );
        assert!(for_exec(&json!({}), json!({}), 1).unwrap_err().contains("no linux section"));
    }
}
