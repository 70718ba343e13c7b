//! Builds the holder (`holder/main.rs`, a `no_std` program without libc) with the same rustc
//! cargo uses, so the shim can embed it. It is compiled on its own, not as a crate of the
//! workspace, because it needs `panic=abort` and its own startup code whatever profile cargo uses.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=holder/main.rs");
    println!("cargo:rerun-if-changed=src/holder/protocol.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("corral-holder");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let target = std::env::var("TARGET").expect("TARGET");
    let status = Command::new(rustc)
        .args(["--edition=2021", "--crate-type=bin", "--crate-name=corral_holder", "--target", &target])
        .args(["-C", "panic=abort", "-C", "opt-level=s", "-C", "relocation-model=static"])
        .args(["-C", "debuginfo=0", "-C", "strip=symbols", "-C", "codegen-units=1"])
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib", "-C", "link-arg=-static"])
        .args(["-C", "link-arg=-Wl,--build-id=none"])
        .arg("-o")
        .arg(&out)
        .arg("holder/main.rs")
        .status()
        .expect("run rustc for the holder");
    assert!(status.success(), "building the holder (holder/main.rs) failed");
}
