//! One module per command: its flags (those it alone has; the shared groups
//! are in [`crate::config`]) and what it does. `main` parses the command
//! line and calls the command's `main`.

pub mod cache;
pub mod function;
pub mod meta;
pub mod pull;
pub mod run;
pub mod serve;
