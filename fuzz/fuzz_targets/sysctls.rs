//! Sysctl validation: lines of `key=value` from the input, under every namespace mode.
#![no_main]
use corral::pod::spec::NsMode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let requested = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for network in [NsMode::Pod, NsMode::Node] {
        for ipc in [NsMode::Pod, NsMode::Node] {
            if let Ok(resolved) = corral::pod::sysctl::resolve(&requested, network, ipc, false) {
                // Whatever is accepted maps into /proc/sys and nowhere else.
                for key in resolved.keys() {
                    let path = corral::pod::sysctl::proc_path(key);
                    assert!(path.starts_with("/proc/sys/") && !path.contains(".."), "{path}");
                }
            }
        }
    }
});
