//! `sifbox cp`: files and directories into and out of a running sandbox,
//! or a tar stream on stdin/stdout (`-`), as `docker cp` takes them.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sifbox_engine::transfer::{LimitExceeded, Limits, SetId};
use sifbox_engine::Sandbox;

use crate::cmd::options::bad;
use crate::error::CliError;

#[derive(Debug, clap::Args)]
pub struct CpArgs {
    /// For uploads: the user of the image that owns the copy (default root).
    #[arg(long, value_name = "USER")]
    pub owner: Option<String>,
    /// For downloads: keep setuid and setgid bits, which are dropped by
    /// default (also from a tar stream written to stdout). Dangerous: a
    /// sandbox can plant a setuid file that then runs on the host as you
    /// (as root, when you are root).
    #[arg(long)]
    pub keep_setid: bool,
    /// Follow a symlink at SRC itself: what it points to is copied, under
    /// the link's name. Symlinks below SRC are always copied as links.
    #[arg(short = 'L', long = "follow-link")]
    pub follow_link: bool,
    /// For downloads: the most file data the copy may write (holes of
    /// sparse files are free), as 512k, 64m, 16g; past it the copy fails
    /// and what it wrote is removed.
    #[arg(long, value_name = "SIZE", default_value = "16g")]
    pub max_size: String,
    /// For downloads: the most entries (files, directories, links) the
    /// copy may write; past it the copy fails and what it wrote is removed.
    #[arg(long, value_name = "N", default_value_t = sifbox_engine::transfer::sparse::DEFAULT_MAX_ENTRIES)]
    pub max_files: u64,
    /// Source: a host path, NAME:/path in a sandbox, or `-`: a tar stream
    /// on stdin, unpacked into the directory NAME:/dir (which must exist).
    pub src: String,
    /// Destination: a host path, NAME:/path in a sandbox, or `-`: a tar
    /// stream of NAME:/path written to stdout.
    pub dst: String,
}

/// One side of a copy.
enum Side<'a> {
    Host(&'a str),
    /// NAME, /path.
    Sandbox(&'a str, &'a str),
    /// `-`: stdin or stdout.
    Stream,
}

/// `-` -> the stream; `NAME:/path` -> (NAME, /path); host paths (with no
/// `:` before the first `/`) -> the host.
fn side(arg: &str) -> Side<'_> {
    if arg == "-" {
        return Side::Stream;
    }
    match arg.split_once(':') {
        Some((name, path)) if !name.is_empty() && !name.contains('/') => Side::Sandbox(name, path),
        _ => Side::Host(arg),
    }
}

const USAGE: &str = "usage: sifbox cp [-L] [--owner USER | --keep-setid] SRC DST, with NAME:/path \
                     on exactly one side and a host path or - (a tar stream on stdin or stdout) \
                     on the other";

pub fn run(a: CpArgs) -> crate::error::Result<ExitCode> {
    match (side(&a.src), side(&a.dst)) {
        (Side::Host(src), Side::Sandbox(name, path)) => {
            check_inside(path)?;
            not_setid(&a)?;
            let sandbox = Sandbox::attach(name)?;
            sandbox.upload_following(
                &PathBuf::from(src),
                path,
                a.owner.as_deref(),
                a.follow_link,
            )?;
        }
        (Side::Sandbox(name, path), Side::Host(dst)) => {
            check_inside(path)?;
            not_owner(&a)?;
            let limits = limits(&a)?;
            let sandbox = Sandbox::attach(name)?;
            let r = sandbox.download_limited(
                path,
                &PathBuf::from(dst),
                setid(&a),
                a.follow_link,
                limits,
            );
            r.map_err(|e| past_limit(e, &a.src, "nothing of it was kept"))?;
        }
        (Side::Stream, Side::Sandbox(name, path)) => {
            check_inside(path)?;
            not_setid(&a)?;
            if a.follow_link {
                return Err(bad(
                    "-L",
                    "follows a symlink at a source path; a tar stream on stdin has none",
                    USAGE,
                ));
            }
            if rustix::termios::isatty(std::io::stdin()) {
                return Err(bad(
                    "sifbox cp - NAME:DIR",
                    "stdin is a terminal, not a tar stream",
                    "pipe one in: tar -C SRC -c . | sifbox cp - NAME:DIR",
                ));
            }
            let sandbox = Sandbox::attach(name)?;
            sandbox.upload_tar(path, a.owner.as_deref(), |mut pipe| {
                std::io::copy(&mut std::io::stdin().lock(), &mut pipe).map(drop)
            })?;
        }
        (Side::Sandbox(name, path), Side::Stream) => {
            check_inside(path)?;
            not_owner(&a)?;
            if rustix::termios::isatty(std::io::stdout()) {
                return Err(bad(
                    "sifbox cp NAME:/path -",
                    "stdout is a terminal; the tar stream would go to it",
                    "send it to a pipe or a file: sifbox cp NAME:/path - | tar -t",
                ));
            }
            let limits = limits(&a)?;
            let sandbox = Sandbox::attach(name)?;
            let out = StdoutStream::default();
            let closed = Arc::clone(&out.closed);
            let copied = sandbox.download_tar(path, a.follow_link, setid(&a), limits, out);
            if closed.load(Ordering::SeqCst) {
                return Err(CliError::StdoutClosed);
            }
            copied.map_err(|e| past_limit(e, &a.src, "the stream was cut short"))?;
        }
        _ => {
            return Err(bad(
                "sifbox cp",
                "one side must be NAME:/path and the other a host path or -",
                USAGE,
            ))
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--max-size` and `--max-files`.
fn limits(a: &CpArgs) -> crate::error::Result<Limits> {
    let max_bytes = sifbox_engine::spec::parse_size(&a.max_size).map_err(|why| {
        bad(
            &format!("--max-size {}", a.max_size),
            &why,
            "give a size such as 512k, 64m or 16g",
        )
    })?;
    Ok(Limits {
        max_bytes,
        max_entries: a.max_files,
    })
}

/// A download that passed a limit: one error naming the limit and its
/// flag (what it wrote is removed by then).
fn past_limit(e: sifbox_engine::Error, src: &str, after: &str) -> crate::error::CliError {
    let Some(l) = LimitExceeded::find(&e) else {
        return e.into();
    };
    let (flag, what) = match l.which {
        sifbox_engine::transfer::sparse::Limit::Bytes => ("--max-size", "bytes of file data"),
        sifbox_engine::transfer::sparse::Limit::Entries => ("--max-files", "entries"),
    };
    bad(
        &format!("sifbox cp {src}"),
        &format!(
            "the copy passed its limit of {} {what} ({flag}); {after}",
            l.limit
        ),
        &format!("raise the limit with {flag}, or copy less"),
    )
}

fn setid(a: &CpArgs) -> SetId {
    if a.keep_setid {
        SetId::Keep
    } else {
        SetId::Strip
    }
}

fn not_setid(a: &CpArgs) -> crate::error::Result<()> {
    if a.keep_setid {
        return Err(bad(
            "--keep-setid",
            "only applies to copies out of a sandbox (uploads keep the bits)",
            USAGE,
        ));
    }
    Ok(())
}

fn not_owner(a: &CpArgs) -> crate::error::Result<()> {
    if a.owner.is_some() {
        return Err(bad(
            "--owner",
            "only applies to copies into a sandbox",
            USAGE,
        ));
    }
    Ok(())
}

fn check_inside(path: &str) -> crate::error::Result<()> {
    if path.starts_with('/') {
        Ok(())
    } else {
        Err(bad(
            &format!("sandbox path {path:?}"),
            "must be absolute",
            "write it as NAME:/absolute/path",
        ))
    }
}

/// stdout for a tar stream, noting when its reader went away (EPIPE):
/// then the copy ends quietly, as every command does on a closed stdout.
#[derive(Default)]
struct StdoutStream {
    closed: Arc<AtomicBool>,
}

impl StdoutStream {
    fn note<T>(&self, r: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &r {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                self.closed.store(true, Ordering::SeqCst);
            }
        }
        r
    }
}

impl Write for StdoutStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let r = std::io::stdout().lock().write(buf);
        self.note(r)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let r = std::io::stdout().lock().flush();
        self.note(r)
    }
}
