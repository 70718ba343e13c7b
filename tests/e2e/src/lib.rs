//! End-to-end tests live in tests/; see tests/rig for the harness.
