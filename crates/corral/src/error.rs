//! The crate error. Variants say which kind of failure it is; the message says which step failed
//! and on what (a field, a path, a container id). [`From<Error> for ttrpc::Error`] is the one place
//! that picks the gRPC code containerd sees.

use std::path::Path;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request carries something corral refuses (bad option, field, path).
    #[error("{0}")]
    InvalidArgument(String),
    /// An id corral does not know.
    #[error("{0}")]
    NotFound(String),
    /// The object exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// The operation does not fit the object's current state.
    #[error("{0}")]
    FailedPrecondition(String),
    /// A part of the API corral does not implement (yet), said plainly.
    #[error("{0}")]
    Unimplemented(String),
    /// A system call or file operation failed; `what` names the step and its object.
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// The OCI runtime (`runtime`: its program's name, e.g. runc or corral-oci) failed;
    /// `message` is the runtime's own last error.
    #[error("{runtime} {op} {id}: {message}")]
    Runtime { runtime: String, op: &'static str, id: String, message: String },
    /// The holder process reported a failure at `step`.
    #[error("pod holder: {step}: {message}")]
    Holder { step: String, message: String },
    /// A bug in corral (a panic caught at the request's boundary).
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { what: what.into(), source }
    }

    pub fn sys(what: impl Into<String>, errno: nix::Error) -> Self {
        Error::Io { what: what.into(), source: std::io::Error::from(errno) }
    }

    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }

    pub fn not_found(msg: impl Into<String>) -> Self {
        Error::NotFound(msg.into())
    }

    pub fn precondition(msg: impl Into<String>) -> Self {
        Error::FailedPrecondition(msg.into())
    }
}

/// Attaches the failed step and its path to an io error, so no call site forgets them.
pub trait IoContext<T> {
    fn with_path(self, step: &str, path: &Path) -> Result<T>;
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn with_path(self, step: &str, path: &Path) -> Result<T> {
        self.map_err(|e| Error::io(format!("{step} {}", path.display()), e))
    }
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(what(), e))
    }
}

impl<T> IoContext<T> for nix::Result<T> {
    fn with_path(self, step: &str, path: &Path) -> Result<T> {
        self.map_err(|e| Error::sys(format!("{step} {}", path.display()), e))
    }
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::sys(what(), e))
    }
}

impl From<Error> for ttrpc::Error {
    fn from(err: Error) -> Self {
        use ttrpc::Code;
        let code = match &err {
            Error::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            Error::NotFound(_) => Code::NOT_FOUND,
            Error::AlreadyExists(_) => Code::ALREADY_EXISTS,
            Error::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            Error::Unimplemented(_) => Code::UNIMPLEMENTED,
            Error::Internal(_) => Code::INTERNAL,
            Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Code::NOT_FOUND,
            Error::Io { .. } | Error::Runtime { .. } | Error::Holder { .. } => Code::UNKNOWN,
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, err.to_string()))
    }
}
