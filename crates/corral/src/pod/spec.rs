//! CreateSandbox options -> a validated [`PodSpec`].
//!
//! containerd 2.1 sends the full CRI `runtime.v1.PodSandboxConfig` as a protobuf `Any`; nothing else
//! describes the pod. Every check here names the field it refuses, and nothing is created before all
//! checks pass.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_cri::v1::{NamespaceMode, PodSandboxConfig};
use prost::Message;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::pod::sysctl;

/// The type URL containerd 2.1 puts on CreateSandboxRequest.options.
pub const POD_CONFIG_TYPE: &str = "runtime.v1.PodSandboxConfig";

/// Where a pod namespace comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NsMode {
    /// One namespace shared by the pod's containers, owned by the holder.
    Pod,
    /// The node's namespace.
    Node,
    /// Each container gets its own (PID only; kubelet's default).
    Container,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// What corral needs to know about a pod, validated.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// The UTS hostname: the pod's, or the node's when the pod sets none.
    pub hostname: String,
    pub network: NsMode,
    pub pid: NsMode,
    pub ipc: NsMode,
    /// CRI's network namespace (network mode POD only).
    pub netns_path: Option<PathBuf>,
    /// `None`: copy the node's resolv.conf.
    pub dns: Option<Dns>,
    /// Sysctls to apply in the pod's namespaces, containerd's defaults included.
    pub sysctls: BTreeMap<String, String>,
    pub cgroup_parent: String,
    /// `cgroup_parent` as a cgroupfs path, under the configured driver (`None` without one).
    #[serde(default)]
    pub cgroup_parent_path: Option<String>,
    /// The size of the pod's /dev/shm, from corral's configuration.
    #[serde(default)]
    pub shm_size_kib: u64,
    /// User namespace mode POD: the holder joins the user namespace that owns CRI's netns (CRI
    /// made both), and every other pod namespace is created inside it. The mappings are CRI's.
    #[serde(default)]
    pub user_namespace: bool,
    /// Resources for the sandbox cgroup (`linux.resources`).
    #[serde(default)]
    pub resources: crate::cgroups::Resources,
}

/// Decodes and validates CreateSandbox's `options` and `netns_path`; corral's configuration
/// decides what the pod does not say (default sysctls, cgroup driver, shm size).
pub fn decode(type_url: Option<&str>, value: &[u8], netns_path: &str, settings: &Config) -> Result<PodSpec> {
    let type_url = type_url.ok_or_else(|| {
        Error::invalid("options: missing; corral needs the CRI PodSandboxConfig (containerd 2.1+ with CRI)")
    })?;
    // containerd 2.1 sends the bare name; other clients may prefix it with a host.
    if type_url != POD_CONFIG_TYPE && !type_url.ends_with(&format!("/{POD_CONFIG_TYPE}")) {
        return Err(Error::invalid(format!("options.type_url: {type_url:?} is not {POD_CONFIG_TYPE:?}")));
    }
    let config = PodSandboxConfig::decode(value)
        .map_err(|e| Error::invalid(format!("options.value: not a PodSandboxConfig: {e}")))?;
    from_config(&config, netns_path, settings)
}

pub fn from_config(config: &PodSandboxConfig, netns_path: &str, settings: &Config) -> Result<PodSpec> {
    let meta =
        config.metadata.as_ref().ok_or_else(|| Error::invalid("PodSandboxConfig.metadata: missing"))?;
    let linux = config.linux.clone().unwrap_or_default();
    let ns = linux.security_context.as_ref().and_then(|sc| sc.namespace_options.clone()).unwrap_or_default();

    let network = mode("network", ns.network, &[NamespaceMode::Pod, NamespaceMode::Node])?;
    let pid = mode("pid", ns.pid, &[NamespaceMode::Pod, NamespaceMode::Container, NamespaceMode::Node])?;
    let ipc = mode("ipc", ns.ipc, &[NamespaceMode::Pod, NamespaceMode::Node])?;

    let user_namespace = match ns.userns_options.as_ref().map(|u| u.mode) {
        None => false,
        Some(raw) => match NamespaceMode::try_from(raw) {
            Ok(NamespaceMode::Node) => false,
            Ok(NamespaceMode::Pod) if network == NsMode::Pod && ipc == NsMode::Pod => true,
            Ok(NamespaceMode::Pod) if network != NsMode::Pod => {
                return Err(Error::invalid(
                    "PodSandboxConfig.linux.security_context.namespace_options.userns_options.mode: POD needs the pod's own network namespace",
                ))
            }
            // As Kubernetes validates: the node's IPC namespace (and /dev/shm, which corral would
            // idmap for the pod's root) is not for a user-namespaced pod.
            Ok(NamespaceMode::Pod) => {
                return Err(Error::invalid(
                    "PodSandboxConfig.linux.security_context.namespace_options.userns_options.mode: POD needs the pod's own IPC namespace (hostIPC is set)",
                ))
            }
            _ => {
                return Err(Error::invalid(format!(
                    "PodSandboxConfig.linux.security_context.namespace_options.userns_options.mode: {raw} is not POD or NODE"
                )))
            }
        },
    };
    let netns_path = match network {
        NsMode::Pod => {
            if netns_path.is_empty() {
                return Err(Error::invalid("netns_path: empty, but the pod's network namespace mode is POD"));
            }
            let path = PathBuf::from(netns_path);
            if !path.is_absolute() {
                return Err(Error::invalid(format!("netns_path: {netns_path:?} is not absolute")));
            }
            Some(path)
        }
        _ => None,
    };

    let hostname = if config.hostname.is_empty() {
        nix::unistd::gethostname()
            .map_err(|e| Error::sys("read the node's hostname", e))?
            .to_string_lossy()
            .into_owned()
    } else {
        config.hostname.clone()
    };
    validate_hostname(&hostname)
        .map_err(|why| Error::invalid(format!("PodSandboxConfig.hostname: {hostname:?} {why}")))?;

    let dns = config.dns_config.as_ref().map(|d| Dns {
        servers: d.servers.clone(),
        searches: d.searches.clone(),
        options: d.options.clone(),
    });
    if let Some(d) = &dns {
        for (field, values) in [("servers", &d.servers), ("searches", &d.searches), ("options", &d.options)] {
            for v in values.iter() {
                if v.is_empty() || v.chars().any(|c| c.is_control() || c.is_whitespace()) {
                    return Err(Error::invalid(format!(
                        "PodSandboxConfig.dns_config.{field}: {v:?} is empty or has whitespace or control characters"
                    )));
                }
            }
        }
    }

    let mut sysctls = sysctl::resolve(&linux.sysctls, network, ipc, user_namespace)?;
    if !settings.pod.default_sysctls {
        // Only what the pod asked for.
        let asked: Vec<String> = linux.sysctls.keys().map(|k| sysctl::normalize(k)).collect();
        sysctls.retain(|k, _| asked.contains(k));
    }
    let cgroup_parent_path = match linux.cgroup_parent.is_empty() {
        true => None,
        false => Some(crate::cgroups::path::resolve_parent_as(&linux.cgroup_parent, settings.cgroup.driver)?),
    };
    let resources = linux
        .resources
        .as_ref()
        .map(|r| crate::cgroups::Resources {
            cpu_shares: (r.cpu_shares > 0).then_some(r.cpu_shares as u64),
            cpu_quota: (r.cpu_quota != 0).then_some(r.cpu_quota),
            cpu_period: (r.cpu_period > 0).then_some(r.cpu_period as u64),
            memory_limit: (r.memory_limit_in_bytes > 0).then_some(r.memory_limit_in_bytes),
        })
        .unwrap_or_default();

    Ok(PodSpec {
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        hostname,
        network,
        pid,
        ipc,
        netns_path,
        dns,
        sysctls,
        cgroup_parent: linux.cgroup_parent,
        cgroup_parent_path,
        shm_size_kib: settings.shm_size_kib(),
        user_namespace,
        resources,
    })
}

fn mode(field: &str, raw: i32, allowed: &[NamespaceMode]) -> Result<NsMode> {
    let parsed = NamespaceMode::try_from(raw).map_err(|_| {
        Error::invalid(format!(
            "PodSandboxConfig.linux.security_context.namespace_options.{field}: unknown mode {raw}"
        ))
    })?;
    if !allowed.contains(&parsed) {
        return Err(Error::invalid(format!(
            "PodSandboxConfig.linux.security_context.namespace_options.{field}: mode {} is not valid for a pod",
            parsed.as_str_name()
        )));
    }
    Ok(match parsed {
        NamespaceMode::Pod => NsMode::Pod,
        NamespaceMode::Node => NsMode::Node,
        // TARGET is excluded by every `allowed` list above.
        NamespaceMode::Container | NamespaceMode::Target => NsMode::Container,
    })
}

/// A hostname the kernel and resolvers accept: 1-64 bytes of letters, digits, '-' and '.',
/// not starting or ending with '-' or '.'.
fn validate_hostname(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters long");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
        return Err("may hold only letters, digits, '-' and '.'");
    }
    let edge = |b: u8| b == b'-' || b == b'.';
    if edge(name.as_bytes()[0]) || edge(name.as_bytes()[name.len() - 1]) {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_cri::v1::{
        DnsConfig, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceOption, PodSandboxMetadata,
    };

    fn config(ns: Option<NamespaceOption>) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: "web".into(),
                uid: "uid-1".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: "web-0".into(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/pod1".into(),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: ns,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn kubelet_ns() -> Option<NamespaceOption> {
        Some(NamespaceOption {
            network: NamespaceMode::Pod as i32,
            pid: NamespaceMode::Container as i32,
            ipc: NamespaceMode::Pod as i32,
            ..Default::default()
        })
    }

    #[test]
    fn decodes_a_kubelet_pod_from_its_protobuf_bytes() {
        let bytes = config(kubelet_ns()).encode_to_vec();
        let spec = decode(Some(POD_CONFIG_TYPE), &bytes, "/var/run/netns/cni-1", &Config::default()).unwrap();
        assert_eq!(spec.name, "web");
        assert_eq!(spec.namespace, "default");
        assert_eq!(spec.uid, "uid-1");
        assert_eq!(spec.hostname, "web-0");
        assert_eq!((spec.network, spec.pid, spec.ipc), (NsMode::Pod, NsMode::Container, NsMode::Pod));
        assert_eq!(spec.netns_path.as_deref(), Some(std::path::Path::new("/var/run/netns/cni-1")));
        assert_eq!(spec.cgroup_parent, "/kubepods/pod1");
        assert_eq!(spec.dns, None);
        // containerd's defaults are applied for a pod network namespace.
        assert_eq!(spec.sysctls.get("net.ipv4.ip_unprivileged_port_start").map(String::as_str), Some("0"));
    }

    #[test]
    fn missing_namespace_options_mean_pod_for_all_three() {
        let spec = from_config(&config(None), "/run/netns/x", &Config::default()).unwrap();
        assert_eq!((spec.network, spec.pid, spec.ipc), (NsMode::Pod, NsMode::Pod, NsMode::Pod));
    }

    #[test]
    fn accepts_a_prefixed_type_url_and_dns() {
        let mut c = config(kubelet_ns());
        c.dns_config = Some(DnsConfig {
            servers: vec!["10.0.0.10".into()],
            searches: vec!["svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        });
        let spec = decode(
            Some("types.googleapis.com/runtime.v1.PodSandboxConfig"),
            &c.encode_to_vec(),
            "/run/netns/x",
            &Config::default(),
        )
        .unwrap();
        assert_eq!(spec.dns.unwrap().options, vec!["ndots:5"]);
    }

    #[test]
    fn refuses_bad_input_naming_the_field() {
        let err = |r: Result<PodSpec>| r.unwrap_err().to_string();
        assert!(err(decode(None, &[], "/x", &Config::default())).starts_with("options: missing"));
        assert!(err(decode(Some("foo.Bar"), &[], "/x", &Config::default())).starts_with("options.type_url"));
        assert!(err(decode(Some(POD_CONFIG_TYPE), &[0xff, 0xff, 0xff], "/x", &Config::default()))
            .starts_with("options.value"));
        assert!(err(from_config(&PodSandboxConfig::default(), "/x", &Config::default())).contains("metadata"));
        assert!(
            err(from_config(&config(kubelet_ns()), "", &Config::default())).starts_with("netns_path: empty")
        );
        assert!(
            err(from_config(&config(kubelet_ns()), "rel/ns", &Config::default())).contains("not absolute")
        );

        let mut c = config(kubelet_ns());
        c.hostname = "bad_host!".into();
        assert!(err(from_config(&c, "/x", &Config::default())).starts_with("PodSandboxConfig.hostname"));

        let mut ns = kubelet_ns().unwrap();
        ns.ipc = 7;
        assert!(err(from_config(&config(Some(ns.clone())), "/x", &Config::default()))
            .contains("namespace_options.ipc: unknown mode 7"));
        ns.ipc = NamespaceMode::Target as i32;
        assert!(err(from_config(&config(Some(ns)), "/x", &Config::default()))
            .contains("namespace_options.ipc: mode TARGET"));
        // A user-namespaced pod gets neither the node's network nor its IPC (and /dev/shm).
        let mut ns = kubelet_ns().unwrap();
        ns.userns_options =
            Some(k8s_cri::v1::UserNamespace { mode: NamespaceMode::Pod as i32, ..Default::default() });
        ns.ipc = NamespaceMode::Node as i32;
        assert!(err(from_config(&config(Some(ns.clone())), "/x", &Config::default()))
            .contains("userns_options.mode: POD needs the pod's own IPC namespace"));
        ns.ipc = NamespaceMode::Pod as i32;
        assert!(from_config(&config(Some(ns)), "/x", &Config::default()).unwrap().user_namespace);

        let mut c = config(kubelet_ns());
        c.dns_config =
            Some(DnsConfig { servers: vec!["1.1.1.1\nnameserver 6.6.6.6".into()], ..Default::default() });
        assert!(err(from_config(&c, "/x", &Config::default())).contains("dns_config.servers"));
    }

    #[test]
    fn corral_settings_decide_what_the_pod_does_not_say() {
        let mut settings = Config::default();
        let spec = from_config(&config(kubelet_ns()), "/x", &settings).unwrap();
        assert_eq!(spec.cgroup_parent_path.as_deref(), Some("/kubepods/pod1"));
        assert_eq!(spec.shm_size_kib, 65536);
        assert!(spec.sysctls.contains_key("net.ipv4.ip_unprivileged_port_start"), "containerd's defaults");

        settings.pod.default_sysctls = false;
        settings.pod.shm_size = "16Mi".into();
        settings.cgroup.driver = crate::config::Driver::Systemd;
        let mut c = config(kubelet_ns());
        c.linux.as_mut().unwrap().cgroup_parent = "kubepods-pod1.slice".into();
        let spec = from_config(&c, "/x", &settings).unwrap();
        assert_eq!(spec.cgroup_parent_path.as_deref(), Some("/kubepods.slice/kubepods-pod1.slice"));
        assert_eq!(spec.shm_size_kib, 16384);
        assert!(spec.sysctls.is_empty(), "only what the pod asked for");
        // A cgroupfs path under a forced systemd driver is refused, naming the field.
        let err = from_config(&config(kubelet_ns()), "/x", &settings).unwrap_err().to_string();
        assert!(err.contains("cgroup_parent"), "{err}");
    }

    #[test]
    fn host_network_needs_no_netns() {
        let mut ns = kubelet_ns().unwrap();
        ns.network = NamespaceMode::Node as i32;
        let spec = from_config(&config(Some(ns)), "", &Config::default()).unwrap();
        assert_eq!(spec.netns_path, None);
        assert!(!spec.sysctls.contains_key("net.ipv4.ip_unprivileged_port_start"));
    }
}
