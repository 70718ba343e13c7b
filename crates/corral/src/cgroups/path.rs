//! cgroup paths as kubelet and CRI write them: cgroupfs (`/kubepods/burstable/pod1`) or the
//! systemd driver's slice names (`kubepods-burstable-pod1.slice`, and for containers
//! `slice:prefix:name`). The systemd form is detected from its shape, since containerd 2.1 cannot
//! pass runc's SystemdCgroup option to corral.

use crate::config::Driver;
use crate::error::{Error, Result};

/// Expands a slice name into its cgroupfs path: `a-b-c.slice` -> `/a.slice/a-b.slice/a-b-c.slice`.
pub fn expand_slice(slice: &str) -> Result<String> {
    let name = slice
        .strip_suffix(".slice")
        .ok_or_else(|| Error::invalid(format!("cgroup slice {slice:?}: does not end in .slice")))?;
    if name.is_empty() || name == "-" {
        return Ok("/".into());
    }
    if name.contains('/') || name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err(Error::invalid(format!("cgroup slice {slice:?}: malformed name")));
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push('/');
        path.push_str(&prefix);
        path.push_str(".slice");
    }
    Ok(path)
}

/// Whether a pod's `cgroup_parent` names a systemd slice (the systemd driver's form) rather than
/// a cgroupfs path.
pub fn is_slice(parent: &str) -> bool {
    parent.ends_with(".slice") && !parent.contains('/')
}

/// The pod's `cgroup_parent` as a cgroupfs path. Refuses `..` and relative paths, so a pod
/// cannot point corral outside the cgroup tree; a forced driver refuses the other form.
pub fn resolve_parent_as(parent: &str, driver: Driver) -> Result<String> {
    let field = "PodSandboxConfig.linux.cgroup_parent";
    let slice = is_slice(parent);
    match (driver, slice) {
        (Driver::Systemd, false) => {
            return Err(Error::invalid(format!(
                "{field}: {parent:?} is not a systemd slice (cgroup.driver = systemd)"
            )))
        }
        (Driver::Cgroupfs, true) => {
            return Err(Error::invalid(format!(
                "{field}: {parent:?} is a systemd slice (cgroup.driver = cgroupfs)"
            )))
        }
        _ => {}
    }
    if parent.split('/').any(|p| p == "..") {
        return Err(Error::invalid(format!("{field}: {parent:?} contains '..'")));
    }
    if slice {
        return expand_slice(parent).map_err(|e| Error::invalid(format!("{field}: {e}")));
    }
    if !parent.starts_with('/') {
        return Err(Error::invalid(format!("{field}: {parent:?} is neither an absolute path nor a slice")));
    }
    Ok(parent.to_string())
}

/// A container's `linux.cgroupsPath` as a cgroupfs path (`slice:prefix:name` for systemd).
pub fn resolve_container(cgroups_path: &str) -> Result<String> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    match parts.as_slice() {
        [slice, prefix, name] => {
            let base = if slice.is_empty() { "/system.slice".to_string() } else { expand_slice(slice)? };
            let unit =
                if prefix.is_empty() { format!("{name}.scope") } else { format!("{prefix}-{name}.scope") };
            Ok(format!("{}/{unit}", base.trim_end_matches('/')))
        }
        [path] if path.starts_with('/') && !path.split('/').any(|p| p == "..") => Ok(path.to_string()),
        _ => Err(Error::invalid(format!("linux.cgroupsPath: {cgroups_path:?} is not a cgroup path"))),
    }
}

/// Whether a container's `linux.cgroupsPath` needs runc's systemd cgroup manager: a
/// `slice:prefix:name` path (what CRI writes when the pod's cgroup_parent is a slice) does,
/// unless corral's configuration forces the cgroupfs driver, which refuses it (as a forced
/// systemd driver refuses a plain path).
pub fn container_uses_systemd(cgroups_path: &str, driver: Driver) -> Result<bool> {
    let systemd_form = cgroups_path.split(':').count() == 3;
    match (driver, systemd_form) {
        (Driver::Cgroupfs, true) => Err(Error::invalid(format!(
            "linux.cgroupsPath: {cgroups_path:?} is a systemd unit but cgroup.driver is cgroupfs"
        ))),
        (Driver::Systemd, false) => Err(Error::invalid(format!(
            "linux.cgroupsPath: {cgroups_path:?} is not slice:prefix:name but cgroup.driver is systemd"
        ))),
        (_, systemd_form) => Ok(systemd_form),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_systemd_slices() {
        assert_eq!(
            expand_slice("kubepods-burstable-pod1.slice").unwrap(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice"
        );
        assert_eq!(expand_slice("-.slice").unwrap(), "/");
        assert!(expand_slice("a--b.slice").is_err());
    }

    #[test]
    fn systemd_container_paths_need_runcs_systemd_manager() {
        let path = "kubepods-pod1.slice:cri-containerd:c1";
        assert!(container_uses_systemd(path, Driver::Auto).unwrap());
        assert!(container_uses_systemd(path, Driver::Systemd).unwrap());
        assert!(!container_uses_systemd("/kubepods/pod1/c1", Driver::Auto).unwrap());
        assert!(!container_uses_systemd("/kubepods/pod1/c1", Driver::Cgroupfs).unwrap());
        let err = container_uses_systemd(path, Driver::Cgroupfs).unwrap_err().to_string();
        assert!(err.starts_with("linux.cgroupsPath") && err.contains("cgroupfs"), "{err}");
        let err = container_uses_systemd("/kubepods/pod1/c1", Driver::Systemd).unwrap_err().to_string();
        assert!(err.starts_with("linux.cgroupsPath") && err.contains("systemd"), "{err}");
    }

    #[test]
    fn resolves_pod_and_container_paths() {
        let auto = |p: &str| resolve_parent_as(p, Driver::Auto);
        assert_eq!(auto("/kubepods/burstable/pod1").unwrap(), "/kubepods/burstable/pod1");
        assert_eq!(auto("kubepods-pod1.slice").unwrap(), "/kubepods.slice/kubepods-pod1.slice");
        assert!(auto("/kubepods/../../etc").unwrap_err().to_string().contains("cgroup_parent"));
        assert!(auto("relative").is_err());
        assert_eq!(resolve_container("/k8s.io/abc").unwrap(), "/k8s.io/abc");
        assert_eq!(
            resolve_container("kubepods-pod1.slice:cri-containerd:abc").unwrap(),
            "/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope"
        );
        assert!(resolve_container("../x").is_err());
        assert!(resolve_parent_as("/kubepods/pod1", Driver::Systemd)
            .unwrap_err()
            .to_string()
            .contains("cgroup.driver = systemd"));
        assert!(resolve_parent_as("kubepods-pod1.slice", Driver::Cgroupfs)
            .unwrap_err()
            .to_string()
            .contains("cgroup.driver = cgroupfs"));
        assert_eq!(
            resolve_parent_as("kubepods-pod1.slice", Driver::Systemd).unwrap(),
            "/kubepods.slice/kubepods-pod1.slice"
        );
    }
}
