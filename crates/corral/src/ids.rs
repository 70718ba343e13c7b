//! Ids from containerd (sandbox, container and exec ids, and the `-id` flag): checked here, in
//! one place, because they become runc ids, file names below corral's directories, socket hashes
//! and cgroup names.

use crate::error::{Error, Result};

/// Keeps an id to a safe alphabet; `field` names it in the error.
pub fn validate(field: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !id.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("{field}: {id:?} is not a valid id (1-128 of [A-Za-z0-9_.-])")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_containerd_ids_and_refuses_paths() {
        for ok in ["a", "0123abcdef", "nginx_1.2-x", &"f".repeat(128)] {
            assert!(validate("id", ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "../x", "a b", "a\0", &"f".repeat(129)] {
            let err = validate("sandbox_id", bad).unwrap_err().to_string();
            assert!(err.contains("sandbox_id"), "{err}");
        }
    }
}
