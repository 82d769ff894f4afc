//! One module per subcommand; each returns the process exit code.

pub(crate) mod build;
pub(crate) mod check;
pub(crate) mod diff;
pub(crate) mod explain;
pub(crate) mod fmt;
pub(crate) mod graph;
pub(crate) mod init;
pub(crate) mod lock;
pub(crate) mod test;
