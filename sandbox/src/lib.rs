//! Sandbox (see issue 3).
