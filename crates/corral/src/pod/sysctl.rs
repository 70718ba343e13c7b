//! Pod sysctls: only keys that live in a namespace the pod owns are accepted, so a pod can never
//! change the host. containerd's podsandbox controller adds two defaults; corral does the same.

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::pod::spec::NsMode;

/// Defaults containerd applies to pods with their own network namespace (unless set by the pod).
const UNPRIVILEGED_PORTS: (&str, &str) = ("net.ipv4.ip_unprivileged_port_start", "0");
/// Only without a user namespace: inside one, the range must consist of mapped gids.
const UNPRIVILEGED_ICMP: (&str, &str) = ("net.ipv4.ping_group_range", "0 2147483647");

/// IPC-namespaced keys (besides `fs.mqueue.*`).
const IPC_KEYS: [&str; 8] = [
    "kernel.shmmax",
    "kernel.shmall",
    "kernel.shmmni",
    "kernel.shm_rmid_forced",
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
];

/// Validates the pod's sysctls and adds containerd's defaults.
pub fn resolve(
    requested: &std::collections::HashMap<String, String>,
    network: NsMode,
    ipc: NsMode,
    user_namespace: bool,
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (key, value) in requested {
        let field = || format!("PodSandboxConfig.linux.sysctls[{key:?}]");
        check_key(key, network, ipc).map_err(|why| Error::invalid(format!("{}: {why}", field())))?;
        if value.is_empty() || value.len() > 4096 || value.chars().any(|c| c.is_control()) {
            return Err(Error::invalid(format!(
                "{}: value {value:?} is empty, too long or has control characters",
                field()
            )));
        }
        out.insert(normalize(key), value.clone());
    }
    if network == NsMode::Pod {
        let mut defaults = vec![UNPRIVILEGED_PORTS];
        if !user_namespace {
            defaults.push(UNPRIVILEGED_ICMP);
        }
        for (k, v) in defaults {
            out.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
    }
    Ok(out)
}

/// The canonical spelling of a key, kubelet's and runc's: dots separate levels and a slash
/// stands for a dot inside a level's name (`net.ipv4.conf.eth0/100.forwarding`). sysctl(8) also
/// takes the other spelling, where slashes separate and dots are literal
/// (`net/ipv4/conf/eth0.100/forwarding`); a key whose first separator is a slash is in that one,
/// and swapping every '/' and '.' turns it into the canonical one.
pub fn normalize(key: &str) -> String {
    match key.find(['.', '/']) {
        Some(i) if key.as_bytes()[i] == b'/' => key
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => key.to_string(),
    }
}

fn check_key(key: &str, network: NsMode, ipc: NsMode) -> std::result::Result<(), String> {
    let key = normalize(key);
    // Every piece between separators is a non-empty word, as kubelet's name pattern requires: a
    // level's name may hold literal dots ('/' here) between words, never be `.` or `..`.
    let well_formed = !key.is_empty()
        && key.split(['.', '/']).all(|word| {
            !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
    if !well_formed {
        return Err("not a well-formed sysctl name".into());
    }
    if key.starts_with("net.") {
        return match network {
            NsMode::Pod => Ok(()),
            _ => Err("net.* sysctls need the pod's own network namespace (hostNetwork is set)".into()),
        };
    }
    if IPC_KEYS.contains(&key.as_str()) || key.starts_with("fs.mqueue.") {
        return match ipc {
            NsMode::Pod => Ok(()),
            _ => Err("IPC sysctls need the pod's own IPC namespace (hostIPC is set)".into()),
        };
    }
    Err("not a namespaced sysctl; it would change the host".into())
}

/// The /proc/sys path of a validated, normalised key: its levels become directories, and a
/// slash inside a level's name is the dot it stands for.
pub fn proc_path(key: &str) -> String {
    let path: String = key
        .chars()
        .map(|c| match c {
            '.' => '/',
            '/' => '.',
            c => c,
        })
        .collect();
    format!("/proc/sys/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn one(k: &str, v: &str) -> HashMap<String, String> {
        HashMap::from([(k.to_string(), v.to_string())])
    }

    #[test]
    fn accepts_namespaced_keys_and_adds_defaults() {
        let got = resolve(&one("net/ipv4/ip_forward", "1"), NsMode::Pod, NsMode::Pod, false).unwrap();
        assert_eq!(got.get("net.ipv4.ip_forward").map(String::as_str), Some("1"));
        assert_eq!(got.get("net.ipv4.ping_group_range").map(String::as_str), Some("0 2147483647"));
        let got = resolve(&one("kernel.shmmax", "1000"), NsMode::Node, NsMode::Pod, false).unwrap();
        assert_eq!(got.len(), 1, "no net defaults with the host network: {got:?}");
    }

    #[test]
    fn no_icmp_default_inside_a_user_namespace() {
        let got = resolve(&HashMap::new(), NsMode::Pod, NsMode::Pod, true).unwrap();
        assert!(!got.contains_key("net.ipv4.ping_group_range"), "{got:?}");
        assert_eq!(got["net.ipv4.ip_unprivileged_port_start"], "0");
    }

    #[test]
    fn a_pod_value_wins_over_the_default() {
        let got =
            resolve(&one("net.ipv4.ip_unprivileged_port_start", "1024"), NsMode::Pod, NsMode::Pod, false)
                .unwrap();
        assert_eq!(got["net.ipv4.ip_unprivileged_port_start"], "1024");
    }

    #[test]
    fn refuses_host_level_and_malformed_keys() {
        for (k, v, net, ipc, why) in [
            ("kernel.panic", "1", NsMode::Pod, NsMode::Pod, "not a namespaced sysctl"),
            ("vm.swappiness", "1", NsMode::Pod, NsMode::Pod, "not a namespaced sysctl"),
            ("net.ipv4.ip_forward", "1", NsMode::Node, NsMode::Pod, "hostNetwork"),
            ("kernel.shmmax", "1", NsMode::Pod, NsMode::Node, "hostIPC"),
            ("net..x", "1", NsMode::Pod, NsMode::Pod, "well-formed"),
            ("net.ipv4/../../x", "1", NsMode::Pod, NsMode::Pod, "well-formed"),
            ("net.ipv4.ip_forward", "1\n", NsMode::Pod, NsMode::Pod, "control"),
        ] {
            let err = resolve(&one(k, v), net, ipc, false).unwrap_err().to_string();
            assert!(err.contains(&format!("sysctls[{k:?}]")), "{err}");
            assert!(err.contains(why), "{k}: {err}");
        }
    }

    #[test]
    fn both_spellings_normalise_to_one_key_and_one_proc_path() {
        for (key, normal, path) in [
            ("net.ipv4.ip_forward", "net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward"),
            ("net/ipv4/ip_forward", "net.ipv4.ip_forward", "/proc/sys/net/ipv4/ip_forward"),
            (
                "net.ipv4.conf.eth0/100.forwarding",
                "net.ipv4.conf.eth0/100.forwarding",
                "/proc/sys/net/ipv4/conf/eth0.100/forwarding",
            ),
            (
                "net/ipv4/conf/eth0.100/forwarding",
                "net.ipv4.conf.eth0/100.forwarding",
                "/proc/sys/net/ipv4/conf/eth0.100/forwarding",
            ),
            // The first separator decides: here a dot, so the slash is a literal dot.
            ("net.ipv6.conf.br0/5/7.mtu", "net.ipv6.conf.br0/5/7.mtu", "/proc/sys/net/ipv6/conf/br0.5.7/mtu"),
            ("kernel/shmmax", "kernel.shmmax", "/proc/sys/kernel/shmmax"),
            ("kernel.sem", "kernel.sem", "/proc/sys/kernel/sem"),
            ("kernel", "kernel", "/proc/sys/kernel"),
        ] {
            assert_eq!(normalize(key), normal, "normalize({key:?})");
            assert_eq!(proc_path(&normalize(key)), path, "proc_path of {key:?}");
        }
    }

    #[test]
    fn a_slash_spelled_key_with_a_literal_dot_is_accepted_and_written_to_its_own_file() {
        let got =
            resolve(&one("net/ipv4/conf/eth0.100/forwarding", "1"), NsMode::Pod, NsMode::Pod, false).unwrap();
        let key = got.keys().find(|k| k.contains("forwarding")).expect("key kept");
        assert_eq!(key, "net.ipv4.conf.eth0/100.forwarding");
        assert_eq!(proc_path(key), "/proc/sys/net/ipv4/conf/eth0.100/forwarding");
        // The allow-list sees the normalised key: slash-spelled IPC and host keys are judged too.
        assert!(resolve(&one("kernel/shmmax", "1"), NsMode::Node, NsMode::Pod, false).is_ok());
        let err = resolve(&one("kernel/panic", "1"), NsMode::Pod, NsMode::Pod, false).unwrap_err();
        assert!(err.to_string().contains("not a namespaced sysctl"), "{err}");
    }

    #[test]
    fn a_literal_dot_cannot_make_a_dot_or_dotdot_path_component() {
        for k in [
            "net.ipv4.conf.//.forwarding",
            "net.ipv4.conf./.forwarding",
            "net/ipv4/conf/../forwarding",
            "net/ipv4/conf/./forwarding",
            "net/ipv4/conf/eth0./forwarding",
            "net.ipv4.conf.eth0/.forwarding",
        ] {
            let err = resolve(&one(k, "1"), NsMode::Pod, NsMode::Pod, false).unwrap_err().to_string();
            assert!(err.contains("well-formed"), "{k}: {err}");
        }
    }
}
