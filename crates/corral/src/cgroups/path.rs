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

/// The pod's `cgroup_parent` as a cgroupfs path, under the configured cgroup driver.
pub fn resolve_parent(parent: &str) -> Result<String> {
    resolve_parent_as(parent, crate::config::get().cgroup.driver)
}

/// The pod's `cgroup_parent` as a cgroupfs path. Refuses `..` and relative paths, so a pod
/// cannot point corral outside the cgroup tree; a forced driver refuses the other form.
pub fn resolve_parent_as(parent: &str, driver: Driver) -> Result<String> {
    let field = "PodSandboxConfig.linux.cgroup_parent";
    let slice = parent.ends_with(".slice") && !parent.contains('/');
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
    if parent.ends_with(".slice") && !parent.contains('/') {
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
    fn resolves_pod_and_container_paths() {
        assert_eq!(resolve_parent("/kubepods/burstable/pod1").unwrap(), "/kubepods/burstable/pod1");
        assert_eq!(resolve_parent("kubepods-pod1.slice").unwrap(), "/kubepods.slice/kubepods-pod1.slice");
        assert!(resolve_parent("/kubepods/../../etc").unwrap_err().to_string().contains("cgroup_parent"));
        assert!(resolve_parent("relative").is_err());
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
