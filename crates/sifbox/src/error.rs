//! The CLI's one error type. The libraries' errors stay typed up to here
//! (a full disk importing an image reads as a full disk, not as a bad
//! reference); [`CliError::fix`] says what to do and
//! [`CliError::exit_code`] what sifbox exits with.

use sifbox_build::error::BuildError;
use sifbox_eval::EvalError;
use sifbox_image::import::ImportError;
use sifbox_image::store::StoreError;
use sifbox_registry::{PullError, ResolveError};

/// An error of a sifbox command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Engine(#[from] sifbox_engine::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Import(#[from] ImportError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Pull(#[from] PullError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Eval(#[from] EvalError),
    /// Boxed: the assembly's errors carry paths and keys.
    #[error(transparent)]
    Launch(Box<sifbox_launch::LaunchError>),
    /// Whoever read stdout went away (`sifbox ... | head`): the command
    /// stops, quietly, with status 0.
    #[error("stdout was closed")]
    StdoutClosed,
}

impl From<sifbox_launch::LaunchError> for CliError {
    fn from(e: sifbox_launch::LaunchError) -> Self {
        CliError::Launch(Box::new(e))
    }
}

/// A command's result.
pub type Result<T, E = CliError> = std::result::Result<T, E>;

impl CliError {
    /// What to do about it, where the message does not already say.
    pub fn fix(&self) -> Option<String> {
        match self {
            // Their messages carry the fix (`what: why; fix`).
            CliError::Engine(_) | CliError::Eval(_) | CliError::StdoutClosed => None,
            CliError::Store(e) => e.fix(),
            CliError::Import(e) => e.fix(),
            CliError::Resolve(e) => Some(e.fix()),
            CliError::Launch(e) => e.fix(),
            CliError::Pull(e) => Some(e.fix()),
            CliError::Build(e) => match e {
                BuildError::Store(s) => s.fix(),
                BuildError::Import(i) => i.fix(),
                _ => None,
            },
        }
    }

    /// The exit status: 125, an error of sifbox itself (see README's exit
    /// codes).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::StdoutClosed => 0,
            _ => crate::EXIT_SIFBOX_ERROR,
        }
    }

    /// The line sifbox prints: the error, then what to do. A full disk
    /// says so first, whatever was being done.
    pub fn line(&self) -> String {
        // (A failed build step's message is its command's output.)
        let step = matches!(self, CliError::Build(BuildError::RunFailed { .. }));
        if !step && is_disk_full(self) {
            return disk_full_line(&self.to_string());
        }
        match self.fix() {
            Some(fix) => format!("{self}; {fix}"),
            None => self.to_string(),
        }
    }
}

/// Whether `e` or any error under it is ENOSPC or EDQUOT. Errors that
/// crossed a process boundary (a sandbox's reply, a build step's message)
/// arrive as text: those are recognised by the OS's own wording.
pub fn is_disk_full(e: &(dyn std::error::Error + 'static)) -> bool {
    fn io_full(e: &std::io::Error) -> bool {
        matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT))
            || e.get_ref().is_some_and(|inner| is_disk_full(inner))
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = cur {
        if e.downcast_ref::<std::io::Error>().is_some_and(io_full) {
            return true;
        }
        let text = e.to_string();
        if text.contains("(os error 28)") || text.contains("(os error 122)") {
            return true;
        }
        cur = e.source();
    }
    false
}

const ENOSPC: i32 = 28;
const EDQUOT: i32 = 122;

/// The line for a full disk: which of sifbox's file systems is short of
/// space (the image store, the scratch dir or the temporary dir: the one
/// with the least free, as what failed has already removed its partial
/// files), with what it has free, then the error and what to do.
pub fn disk_full_line(error: &str) -> String {
    let mut places = vec![(
        "the image store",
        sifbox_image::store::Store::default_root(),
    )];
    if let Some(scratch) = std::env::var_os("SIFBOX_SCRATCH").filter(|s| !s.is_empty()) {
        places.push(("the scratch dir", scratch.into()));
    }
    places.push(("the temporary dir", std::env::temp_dir()));
    let fullest = places
        .into_iter()
        .filter_map(|(what, path)| free_space(&path).map(|free| (free, what, path)))
        .min_by_key(|(free, ..)| *free);
    let place = match fullest {
        Some((free, what, path)) => {
            format!("{what} ({}, {} MB free)", path.display(), free / 1_000_000)
        }
        None => "the disk".to_string(),
    };
    format!(
        "no space left on {place}: {error}; free space there (`sifbox gc` removes what no image \
         needs, `sifbox image rm` unused images), or set SIFBOX_CACHE to a store on a larger disk"
    )
}

/// The bytes free to unprivileged users on the file system holding `path`
/// (or its nearest existing parent).
fn free_space(path: &std::path::Path) -> Option<u64> {
    let mut p = path;
    loop {
        if let Ok(st) = rustix::fs::statvfs(p) {
            return Some(st.f_bavail.saturating_mul(st.f_frsize));
        }
        p = p.parent()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_reads_as_one_and_says_what_to_do() {
        let e = CliError::from(StoreError::Io {
            path: "/store/images".into(),
            source: std::io::Error::from_raw_os_error(28),
        });
        let line = e.line();
        assert!(
            line.starts_with("no space left on the image store ("),
            "{line}"
        );
        assert!(line.contains(" MB free"), "{line}");
        assert!(line.contains("No space left on device"), "{line}");
        assert!(!line.contains("check the reference"), "{line}");
        assert!(line.contains("sifbox gc"), "{line}");
        assert_eq!(e.exit_code(), 125);
    }

    #[test]
    fn a_full_disk_is_found_under_other_errors_and_in_text() {
        // An io::Error wrapping a layer error wrapping ENOSPC.
        #[derive(Debug, thiserror::Error)]
        #[error("layer entry x: cannot write the file: {0}")]
        struct Inner(#[source] std::io::Error);
        let wrapped = std::io::Error::other(Inner(std::io::Error::from_raw_os_error(28)));
        assert!(is_disk_full(&wrapped));
        // A sandbox's reply, as text.
        let e = CliError::Engine(sifbox_engine::Error::Setup(
            "writing /x: No space left on device (os error 28)".into(),
        ));
        assert!(is_disk_full(&e));
        assert!(e.line().starts_with("no space left on "), "{}", e.line());
        // Quota too; other errors not.
        assert!(is_disk_full(&std::io::Error::from_raw_os_error(122)));
        assert!(!is_disk_full(&std::io::Error::from_raw_os_error(32)));
        let e = CliError::Engine(sifbox_engine::Error::Setup("bad".into()));
        assert!(!is_disk_full(&e));
    }
}
