//! The holder's spec decoder (it runs in the no_std holder): any bytes parse or are refused.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(spec) = corral::holder::protocol::parse(data) {
        for (path, value) in corral::holder::protocol::sysctls(spec.raw) {
            assert!(!path.contains(&0) && !value.contains(&0));
        }
    }
});
