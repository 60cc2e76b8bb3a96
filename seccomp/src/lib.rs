//! The default seccomp profile (filled in by the sandbox hardening work).
