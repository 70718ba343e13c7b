//! config.json rewriting: any JSON document is rewritten or refused, never a panic, and an
//! accepted rewrite always carries the pod's files.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut spec) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let pod = corral::task::oci::PodContext {
        sandbox_pid: 42,
        pins: [("net".to_string(), "/b/ns/net".into())].into_iter().collect(),
        hostname: "/b/pod/hostname".into(),
        hosts: "/b/pod/hosts".into(),
        resolv_conf: "/b/pod/resolv.conf".into(),
        shm: "/b/shm".into(),
    };
    if corral::task::oci::rewrite(&mut spec, &pod).is_ok() {
        let mounts = spec["mounts"].as_array().expect("mounts is an array after a rewrite");
        for dest in ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/dev/shm"] {
            assert!(
                mounts.iter().any(|m| m["destination"].as_str().map(|d| d.trim_end_matches('/')) == Some(dest)),
                "no mount at {dest}"
            );
        }
    }
});
