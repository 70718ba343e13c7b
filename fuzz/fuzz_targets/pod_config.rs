//! CreateSandbox options: any bytes as a PodSandboxConfig must give a PodSpec or an error, never
//! a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = corral::pod::spec::decode(
        Some(corral::pod::spec::POD_CONFIG_TYPE),
        data,
        "/run/netns/fuzz",
        &corral::config::Config::default(),
    );
});
