//! Files in and out of a running sandbox: uploads, downloads and the
//! other transfer requests (see [`crate::transfer`]).

use std::path::Component;

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::Path;

use rustix::pipe::{pipe_with, PipeFlags};

use super::Sandbox;
use crate::error::{Error, IoContext, Result};
use crate::protocol::{self, Request};
use crate::transfer;

/// The outcome of a transfer: the sandbox's `reply` and what the host's
/// side of the pipe (`local`) got. When the sandbox failed only because the
/// host stopped reading (a broken pipe), the host's own error is the cause
/// (a full disk, say); otherwise the sandbox's error comes first.
/// Whether the sandbox's error is a broken pipe: the host stopped reading.
fn broke_the_pipe(e: &Error) -> bool {
    e.errno() == Some(libc::EPIPE) || e.to_string().contains("(os error 32)")
}

fn first_failure<R, T>(
    reply: Result<R>,
    local: std::io::Result<T>,
    what: impl FnOnce() -> String,
) -> Result<T> {
    match (reply, local) {
        (Err(r), Err(l)) if broke_the_pipe(&r) => Err(l).ctx(what),
        (Err(r), _) => Err(r),
        (Ok(_), l) => l.ctx(what),
    }
}

/// The name a copy of `p` gets: its last component as written (a symlink's
/// own name, also when `cp -L` copies what it points to), or for `.`, `..`
/// and `/` the name of the directory they stand for.
fn base_name(p: &Path) -> Result<String> {
    if let Some(Component::Normal(n)) = p.components().next_back() {
        return Ok(n.to_string_lossy().into_owned());
    }
    let canon = std::fs::canonicalize(p).ctx(|| format!("{}", p.display()))?;
    Ok(canon
        .file_name()
        .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned()))
}

/// What a download's entries are named after: `src`'s last component, or
/// `root` for `/`.
fn download_name(src: &str) -> String {
    Path::new(src)
        .file_name()
        .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned())
}

/// How a download failed: the sandbox's side (or the request), or the
/// reader of the stream on this side.
enum DownloadError {
    Sandbox(Error),
    Read(std::io::Error),
}

impl From<Error> for DownloadError {
    fn from(e: Error) -> Self {
        DownloadError::Sandbox(e)
    }
}

impl DownloadError {
    /// The engine's error, a reader's with `what` as its context.
    fn ctx_io(self, what: impl FnOnce() -> String) -> Error {
        match self {
            DownloadError::Sandbox(e) => e,
            DownloadError::Read(e) => Error::io(what(), e),
        }
    }
}

/// Which way a transfer's pipe runs.
#[derive(Clone, Copy)]
enum Flow {
    /// The sandbox writes, the host reads.
    Out,
    /// The host writes, the sandbox reads.
    In,
}

impl Sandbox {
    /// Sends `req` with one end of a pipe (the writing end for
    /// [`Flow::Out`], the reading end for [`Flow::In`]) and runs `host`
    /// on the other end in a thread while the sandbox answers; returns the
    /// sandbox's reply and what `host` returned (see [`first_failure`]).
    fn over_pipe<T, F>(
        &self,
        req: &Request,
        flow: Flow,
        host: F,
    ) -> Result<(Result<u64>, std::io::Result<T>)>
    where
        F: FnOnce(File) -> std::io::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (r, w) = pipe_with(PipeFlags::CLOEXEC).map_err(|e| Error::io("pipe", e))?;
        let (theirs, ours) = match flow {
            Flow::Out => (w, r),
            Flow::In => (r, w),
        };
        let conn = self.connect()?;
        protocol::send(&conn, req, &[theirs.as_fd()]).map_err(|e| self.proto(e))?;
        drop(theirs);
        let side = std::thread::spawn(move || host(File::from(ours)));
        let reply = self.reply(&conn);
        let got = side
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the transfer thread panicked")));
        Ok((reply, got))
    }

    /// Copies `src` on the host into the sandbox at `dst` (`docker cp`
    /// rules: into `dst` when it is a directory, else as `dst`). With
    /// `owner` (a user of the image) the copy belongs to that user.
    pub fn upload(&self, src: &Path, dst: &str, owner: Option<&str>) -> Result<()> {
        self.upload_following(src, dst, owner, false)
    }

    /// [`Sandbox::upload`] of the directory `src`, its regular file
    /// `executable` (a path below `src`) given the execute bits on the way,
    /// as `chmod +x` after the copy would.
    pub fn upload_marking_executable(
        &self,
        src: &Path,
        dst: &str,
        owner: Option<&str>,
        executable: &Path,
    ) -> Result<()> {
        let executable = executable.to_path_buf();
        self.upload_writing(src, dst, owner, move |src, name, w| {
            let marked = Path::new(name).join(&executable);
            transfer::write_tar_marking(src, name, Some(&marked), w)
        })
    }

    /// [`Sandbox::upload`]; with `follow`, a symlink at `src` itself is
    /// followed (`cp -L`: what it points to is copied, under its name).
    pub fn upload_following(
        &self,
        src: &Path,
        dst: &str,
        owner: Option<&str>,
        follow: bool,
    ) -> Result<()> {
        self.upload_writing(src, dst, owner, move |src, name, w| {
            if follow {
                transfer::write_tar_following(src, name, w)
            } else {
                transfer::write_tar(src, name, w)
            }
        })
    }

    /// An upload of `src` to `dst` whose tar stream `write` makes (given
    /// `src`, the name it has in the sandbox, and the pipe).
    fn upload_writing<F>(&self, src: &Path, dst: &str, owner: Option<&str>, write: F) -> Result<()>
    where
        F: FnOnce(&Path, &str, File) -> std::io::Result<()> + Send + 'static,
    {
        let name = base_name(src)?;
        let req = Request::Upload {
            dst: dst.to_string(),
            name: name.clone(),
            owner: owner.map(str::to_string),
        };
        let src_owned = src.to_path_buf();
        let (reply, written) =
            self.over_pipe(&req, Flow::In, move |w| write(&src_owned, &name, w))?;
        first_failure(reply, written, || format!("reading {}", src.display()))
    }

    /// Copies `src` in the sandbox to `dst` on the host (`docker cp` rules),
    /// setuid and setgid bits dropped: the stream is the sandbox's and is
    /// unpacked as hostile (see [`transfer`]).
    pub fn download(&self, src: &str, dst: &Path) -> Result<()> {
        self.download_with(src, dst, transfer::SetId::Strip)
    }

    /// [`Sandbox::download`], keeping setuid and setgid bits with
    /// `SetId::Keep`: only for a copy that no one else can reach, as a
    /// sandbox can plant a setuid file that runs as the caller.
    pub fn download_with(&self, src: &str, dst: &Path, setid: transfer::SetId) -> Result<()> {
        self.download_following(src, dst, setid, false)
    }

    /// [`Sandbox::download_with`]; with `follow`, a symlink at `src` itself
    /// is followed inside the sandbox (`cp -L`: what it points to is
    /// copied, under its name).
    pub fn download_following(
        &self,
        src: &str,
        dst: &Path,
        setid: transfer::SetId,
        follow: bool,
    ) -> Result<()> {
        self.download_limited(src, dst, setid, follow, transfer::Limits::default())
    }

    /// [`Sandbox::download_following`] held to `limits`: past one, the
    /// download fails with [`transfer::LimitExceeded`] inside its error and
    /// what it wrote is removed.
    pub fn download_limited(
        &self,
        src: &str,
        dst: &Path,
        setid: transfer::SetId,
        follow: bool,
        limits: transfer::Limits,
    ) -> Result<()> {
        let name = download_name(src);
        let dst_owned = dst.to_path_buf();
        self.download_stream(src, follow, move |r| {
            transfer::unpack_to_host_limited(r, &dst_owned, &name, setid, limits)
        })
        .map_err(|e| e.ctx_io(|| format!("writing {}", dst.display())))
    }

    /// Writes a tar stream of `src` in the sandbox to `out` (`cp NAME:/path
    /// -`), its entries named after `src`'s last component and checked
    /// as a download's are, setuid and setgid bits dropped unless kept (see
    /// [`transfer::retar_limited`]), held to `limits`. With `follow`, a
    /// symlink at `src` itself is followed inside the sandbox.
    pub fn download_tar<W>(
        &self,
        src: &str,
        follow: bool,
        setid: transfer::SetId,
        limits: transfer::Limits,
        out: W,
    ) -> Result<()>
    where
        W: Write + Send + 'static,
    {
        let name = download_name(src);
        self.download_stream(src, follow, move |r| {
            transfer::retar_limited(r, &name, setid, limits, out)
        })
        .map_err(|e| e.ctx_io(|| "writing the tar stream".to_string()))
    }

    /// Asks for a tar stream of `src` and hands the pipe it comes through
    /// to `read`. The sandbox's error, when it has one, comes first (a
    /// reader that failed because the stream stopped says less); else
    /// `read`'s, as [`DownloadError::Read`].
    fn download_stream<F>(
        &self,
        src: &str,
        follow: bool,
        read: F,
    ) -> std::result::Result<(), DownloadError>
    where
        F: FnOnce(File) -> std::io::Result<()> + Send + 'static,
    {
        let req = Request::Download {
            path: src.to_string(),
            follow,
        };
        let (reply, got) = self.over_pipe(&req, Flow::Out, read)?;
        match (reply, got) {
            (Err(r), Err(l)) if broke_the_pipe(&r) => Err(DownloadError::Read(l)),
            (Err(r), _) => Err(r.into()),
            (Ok(_), l) => l.map_err(DownloadError::Read),
        }
    }

    /// Unpacks a tar stream of relative names into the directory `dst` in
    /// the sandbox, which must exist (`cp - NAME:DIR`), confined to it (see
    /// [`transfer::extract_into`]): `write` gets the pipe to write the
    /// stream to. With `owner` (a user of the image) the files belong to
    /// that user; else to root.
    pub fn upload_tar<F>(&self, dst: &str, owner: Option<&str>, write: F) -> Result<()>
    where
        F: FnOnce(File) -> std::io::Result<()> + Send + 'static,
    {
        let req = Request::UploadTar {
            dst: dst.to_string(),
            owner: owner.map(str::to_string),
        };
        let (reply, written) = self.over_pipe(&req, Flow::In, write)?;
        first_failure(reply, written, || {
            format!("sending the tar stream for {dst}")
        })
    }

    /// Unpacks a tar stream of relative names into the directory `dst` in
    /// the sandbox (made with its parents when missing), confined to it:
    /// `write` gets the pipe to write the stream to. Entries belong to
    /// `owner` (numeric ids inside) when given, else to root.
    pub fn extract<F>(&self, dst: &str, owner: Option<(u32, u32)>, write: F) -> Result<()>
    where
        F: FnOnce(File) -> std::io::Result<()> + Send + 'static,
    {
        let req = Request::Extract {
            dst: dst.to_string(),
            owner,
        };
        let (reply, written) = self.over_pipe(&req, Flow::In, write)?;
        first_failure(reply, written, || format!("writing the archive for {dst}"))
    }

    /// Streams a tar of the sandbox's whole root file system (owners as seen
    /// inside, other mounts left out) to `read`, which gets the pipe's
    /// reading end, and returns what it returns.
    pub fn snapshot<T, F>(&self, read: F) -> Result<T>
    where
        F: FnOnce(File) -> std::io::Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, got) = self.over_pipe(&Request::Snapshot, Flow::Out, read)?;
        first_failure(reply, got, || {
            "reading the sandbox's root file system".to_string()
        })
    }

    /// Gives the copy of the root at `dst` the owners of the original (see
    /// [`Request::MirrorOwners`]).
    pub fn mirror_owners(&self, dst: &str) -> Result<()> {
        self.request(
            &Request::MirrorOwners {
                dst: dst.to_string(),
            },
            &[],
        )
        .map(drop)
    }

    /// Removes the tree at `path` inside the sandbox (see
    /// [`Request::Remove`]).
    pub fn remove(&self, path: &str) -> Result<()> {
        self.request(
            &Request::Remove {
                path: path.to_string(),
            },
            &[],
        )
        .map(drop)
    }

    /// Gives the tree at `path` inside the sandbox to its root (see
    /// [`Request::GiveBack`]).
    pub fn give_back(&self, path: &str) -> Result<()> {
        self.request(
            &Request::GiveBack {
                path: path.to_string(),
            },
            &[],
        )
        .map(drop)
    }

    /// Gives `path` inside the sandbox (not followed) to `user` of the
    /// image (see [`Request::Chown`]).
    pub fn chown(&self, path: &str, user: &str) -> Result<()> {
        self.request(
            &Request::Chown {
                path: path.to_string(),
                user: user.to_string(),
            },
            &[],
        )
        .map(drop)
    }

    /// [`Sandbox::chown`] in the guarded mount namespace, where the
    /// sandbox's guarded binds are writable (see [`Request::Guarded`]).
    pub fn chown_guarded(&self, path: &str, user: &str) -> Result<()> {
        let request = Box::new(Request::Chown {
            path: path.to_string(),
            user: user.to_string(),
        });
        self.request(&Request::Guarded { request }, &[]).map(drop)
    }

    /// [`Sandbox::give_back`] in the guarded mount namespace (see
    /// [`Request::Guarded`]).
    pub fn give_back_guarded(&self, path: &str) -> Result<()> {
        let request = Box::new(Request::GiveBack {
            path: path.to_string(),
        });
        self.request(&Request::Guarded { request }, &[]).map(drop)
    }
}
