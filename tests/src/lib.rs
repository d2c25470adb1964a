//! Shared helpers for the cross-process suites live in the test files themselves.
