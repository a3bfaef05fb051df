//! The build context: finding `COPY`/`ADD` sources in it (globs,
//! `.dockerignore`), placing them under Docker's destination rules, hashing
//! what will be copied for the cache key, and writing it as a tar stream.
//!
//! The context is not trusted: it is read through [`Tree`], by fd, never by
//! path. A source is looked up as BuildKit looks it up in the context it was
//! sent: symlinks resolved as if the context were `/`, so that nothing
//! outside it can be named; the source itself followed when it is a symlink
//! (`COPY link /dst` copies what `link` points to), symlinks inside a copied
//! directory copied as symlinks. `.dockerignore` removes what it excludes
//! from the context before any lookup, as Docker does by not sending it: it
//! is matched on every path a lookup steps on and on the resolved path of
//! everything copied, so an alias (`alias -> .`) does not reach an excluded
//! file. The hash of the cache key and the tar stream read the same files
//! again through the context's fd by their resolved paths, refusing any that
//! changed since the lookup.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::error::{BuildError, Result};
use crate::ignore::Ignore;
use crate::tree::{LookupError, Node, Seen, Tree};

/// How deep a copied directory may nest.
const MAX_DEPTH: usize = 512;

/// A build context directory and its `.dockerignore`.
#[derive(Debug)]
pub struct Context {
    tree: Tree,
    ignore: Ignore,
}

/// What one entry of a copy is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File { size: u64 },
    Dir,
    Symlink(PathBuf),
}

/// Where an entry comes from: its resolved path in a tree, and what the
/// lookup saw there.
#[derive(Debug, Clone)]
pub struct Src {
    tree: Tree,
    rel: String,
    seen: Seen,
}

impl Src {
    /// A file of the build's own making (a download in a private temp dir).
    pub fn own_file(path: &Path) -> Result<Src> {
        let (dir, name) = match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
            (Some(d), Some(n)) => (d, n),
            _ => return Err(BuildError::io(path, std::io::Error::other("names no file"))),
        };
        let tree = Tree::open(dir).map_err(|e| BuildError::io(dir, e))?;
        let node = tree
            .lookup(name, false, &|_, _| true)
            .map_err(|e| BuildError::io(path, std::io::Error::other(e.to_string())))?
            .ok_or_else(|| {
                BuildError::io(path, std::io::Error::from(std::io::ErrorKind::NotFound))
            })?;
        Ok(Src {
            tree,
            rel: node.rel,
            seen: Seen::of(&node.stat),
        })
    }

    /// The file opened for reading, checked to be the one the lookup found,
    /// unchanged; never through a symlink. Errors name the file.
    pub fn open(&self) -> std::io::Result<std::fs::File> {
        self.tree
            .open_file(&self.rel, &self.seen)
            .map_err(|e| self.named(e))
    }

    /// Checks that `f` (from [`Src::open`]) is still unchanged, after
    /// reading it. Errors name the file.
    pub fn check(&self, f: &std::fs::File) -> std::io::Result<()> {
        self.tree.check(f, &self.seen).map_err(|e| self.named(e))
    }

    fn named(&self, e: std::io::Error) -> std::io::Error {
        std::io::Error::new(e.kind(), format!("{}: {e}", self.shown().display()))
    }

    /// The host path, for messages.
    pub fn shown(&self) -> PathBuf {
        self.tree.show(&self.rel)
    }
}

/// One entry to copy: where it comes from and its name under the
/// destination directory.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Relative path under the destination directory.
    pub name: PathBuf,
    /// Where its bytes come from.
    pub src: Src,
    pub kind: Kind,
    pub mode: u32,
    pub mtime: u64,
    /// A source the instruction named (not an entry found inside a copied
    /// directory): the only files `ADD` unpacks, as Docker.
    pub top: bool,
}

impl Entry {
    /// A downloaded file (`ADD URL`), named `name`.
    pub fn own_file(path: &Path, name: PathBuf, mode: u32, mtime: u64) -> Result<Entry> {
        let src = Src::own_file(path)?;
        Ok(Entry {
            name,
            kind: Kind::File {
                size: src.seen.size(),
            },
            src,
            mode,
            mtime,
            top: false,
        })
    }
}

/// A planned copy: the destination directory (absolute, inside the image)
/// and the entries to unpack into it.
#[derive(Debug, Clone)]
pub struct CopyPlan {
    pub dest_dir: String,
    pub entries: Vec<Entry>,
}

/// A matched source: its name as written (the last component before
/// symlinks are followed) and what it resolved to.
#[derive(Debug)]
struct Source {
    name: String,
    node: Node,
}

impl Context {
    /// Opens `root`, reading its `.dockerignore` (if any).
    pub fn open(root: &Path) -> Result<Context> {
        let mut ctx = Context::open_plain(root)?;
        let shown = ctx.tree.show(".dockerignore");
        let bytes = ctx.read_file(".dockerignore")?;
        if bytes.is_none()
            && matches!(
                ctx.tree.lookup(".dockerignore", false, &|_, _| true),
                Ok(Some(_))
            )
        {
            // A symlink to nothing inside the context: building without the
            // exclusions it was meant to hold would copy what it excludes.
            return Err(BuildError::bad(
                shown.display().to_string(),
                "a symlink to nothing inside the build context (symlinks are resolved inside it)",
                "make it a file in the context, or a symlink to one",
            ));
        }
        if let Some(bytes) = bytes {
            let text = String::from_utf8(bytes).map_err(|_| {
                BuildError::bad(
                    shown.display().to_string(),
                    "not UTF-8 text",
                    "fix the file (Docker's .dockerignore syntax)",
                )
            })?;
            ctx.ignore = Ignore::parse(&text).map_err(|e| {
                BuildError::bad(
                    shown.display().to_string(),
                    e.to_string(),
                    "fix the pattern (Docker's .dockerignore syntax)",
                )
            })?;
        }
        Ok(ctx)
    }

    /// Opens `root` with nothing excluded (a staging dir of the build's
    /// own: its `.dockerignore`, if one is there, is just a file).
    pub fn open_plain(root: &Path) -> Result<Context> {
        let bad = |why: String| {
            BuildError::bad(
                format!("build context {}", root.display()),
                why,
                "pass an existing directory as CONTEXT",
            )
        };
        // The caller's own path: symlinks in it are followed.
        let root = std::fs::canonicalize(root).map_err(|e| bad(e.to_string()))?;
        let tree = Tree::open(&root).map_err(|e| bad(e.to_string()))?;
        Ok(Context {
            tree,
            ignore: Ignore::default(),
        })
    }

    /// This context with more exclusions (`COPY --exclude`), matched like
    /// `.dockerignore` lines and added after them.
    pub fn with_excludes(&self, patterns: &[String]) -> Result<Context> {
        let mut lines = self.ignore.patterns();
        lines.extend(patterns.iter().cloned());
        let ignore = Ignore::parse(&lines.join("\n")).map_err(|e| {
            BuildError::bad(
                format!("--exclude {patterns:?}"),
                e.to_string(),
                "give patterns in .dockerignore syntax",
            )
        })?;
        Ok(Context {
            tree: self.tree.clone(),
            ignore,
        })
    }

    /// The context directory.
    pub fn root(&self) -> &Path {
        self.tree.path()
    }

    /// The regular file `rel` of the context (symlinks resolved inside it,
    /// `.dockerignore` not applied: Docker always sends the Dockerfile and
    /// `.dockerignore`). `None` when there is none.
    pub fn read_file(&self, rel: &str) -> Result<Option<Vec<u8>>> {
        let shown = self.tree.show(rel);
        let node = match self.tree.lookup(rel, true, &|_, _| true) {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(None),
            Err(e) => return Err(BuildError::io(&shown, std::io::Error::other(e.to_string()))),
        };
        if node.file_type() != rustix::fs::FileType::RegularFile {
            return Err(BuildError::bad(
                shown.display().to_string(),
                "not a regular file",
                "make it a file (or a symlink to a file inside the context)",
            ));
        }
        let seen = Seen::of(&node.stat);
        let mut f = self
            .tree
            .open_file(&node.rel, &seen)
            .map_err(|e| BuildError::io(&shown, e))?;
        let mut out = Vec::new();
        f.read_to_end(&mut out)
            .map_err(|e| BuildError::io(&shown, e))?;
        self.tree
            .check(&f, &seen)
            .map_err(|e| BuildError::io(&shown, e))?;
        Ok(Some(out))
    }

    /// Whether the entry at the resolved path `rel` was sent in Docker's
    /// context: not excluded, or a directory an exception may bring
    /// something back from.
    fn present(&self, rel: &str, is_dir: bool) -> bool {
        !self.ignore.is_excluded(rel, is_dir) || (is_dir && self.ignore.may_reinclude_below(rel))
    }

    fn excluded(&self, rel: &str, is_dir: bool) -> bool {
        !rel.is_empty() && self.ignore.is_excluded(rel, is_dir)
    }

    /// Looks the context path `rel` up, the last symlink followed, what
    /// `.dockerignore` excludes taken as absent.
    fn resolve(&self, rel: &str, written: &str) -> Result<Option<Node>> {
        self.tree
            .lookup(rel, true, &|r, d| self.present(r, d))
            .map_err(|e| lookup_error(written, &e))
    }

    /// The sources a `COPY` source pattern names: a path or a glob (Go's
    /// `filepath.Match` per component), relative to the context root,
    /// never outside it, `.dockerignore` applied. As BuildKit, the
    /// components before the first wildcard are resolved like a path, the
    /// rest are matched against real directories (symlinks are not entered)
    /// and each match is then followed if it is a symlink; a match that
    /// points to nothing is an error.
    fn sources(&self, pattern: &str) -> Result<Vec<Source>> {
        let clean = clean_rel(pattern);
        let last_name = |rel: &str| rel.rsplit('/').next().unwrap_or_default().to_owned();
        if !has_glob(&clean) {
            return Ok(self
                .resolve(&clean, pattern)?
                .map(|node| Source {
                    name: last_name(&clean),
                    node,
                })
                .into_iter()
                .collect());
        }
        let parts: Vec<&str> = clean.split('/').collect();
        let first = parts.iter().position(|p| has_glob(p)).unwrap_or(0);
        let Some(base) = self.resolve(&parts[..first].join("/"), pattern)? else {
            return Ok(Vec::new());
        };
        let mut matched = Vec::new();
        if base.is_dir() {
            self.glob_in(&base, &parts[first..], 0, &mut matched)?;
        }
        let mut out = Vec::new();
        for rel in matched {
            let node = self.resolve(&rel, pattern)?.ok_or_else(|| {
                BuildError::bad(
                    format!("source {pattern:?}"),
                    format!(
                        "it matches {rel:?}, a symlink to nothing in the build context \
                         (or to something .dockerignore excludes)"
                    ),
                    "fix or remove the symlink, or narrow the pattern",
                )
            })?;
            out.push(Source {
                name: last_name(&rel),
                node,
            });
        }
        Ok(out)
    }

    /// Adds the context paths below `dir` that match `parts` (one pattern
    /// per component) to `out`.
    fn glob_in(
        &self,
        dir: &Node,
        parts: &[&str],
        depth: usize,
        out: &mut Vec<String>,
    ) -> Result<()> {
        let Some((part, rest)) = parts.split_first() else {
            return Ok(());
        };
        if depth > MAX_DEPTH {
            return Err(too_deep(&self.tree.show(&dir.rel)));
        }
        let names = if has_glob(part) {
            self.tree
                .list(dir)
                .map_err(|e| BuildError::io(&self.tree.show(&dir.rel), e))?
                .into_iter()
                .filter(|n| {
                    n.to_str()
                        .is_some_and(|n| crate::ignore::glob_match(part, n))
                })
                .collect()
        } else {
            vec![std::ffi::OsString::from(*part)]
        };
        for n in names {
            let child = match self.tree.child(dir, &n) {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(BuildError::io(&self.tree.show(&dir.rel), e)),
            };
            if !self.present(&child.rel, child.is_dir()) {
                continue;
            }
            if rest.is_empty() {
                out.push(child.rel);
            } else if child.is_dir() {
                self.glob_in(&child, rest, depth + 1, out)?;
            }
        }
        Ok(())
    }

    /// Plans `COPY srcs... dest` from the context under Docker's rules.
    /// `dest_is_dir` tells whether `dest` exists as a directory in the
    /// image (it decides where a single file goes when `dest` has no
    /// trailing slash). `chmod` replaces every mode.
    pub fn plan_copy(
        &self,
        srcs: &[String],
        dest: &str,
        dest_is_dir: bool,
        chmod: Option<u32>,
    ) -> Result<CopyPlan> {
        let not_found = |s: &str| {
            BuildError::bad(
                format!("source {s:?}"),
                "not found in the build context (or excluded by .dockerignore)",
                "check the path, relative to the context directory",
            )
        };
        let mut matched = Vec::new();
        for s in srcs {
            let found = self.sources(s)?;
            if found.is_empty() {
                return Err(not_found(s));
            }
            matched.extend(found.into_iter().map(|f| (s, f)));
        }
        let many = matched.len() > 1;
        let trailing = dest.ends_with('/');
        if many && !trailing && !dest_is_dir {
            return Err(BuildError::bad(
                format!("destination {dest:?}"),
                "several sources are copied, so it must be a directory",
                "end the destination with a slash",
            ));
        }
        let mut entries = Vec::new();
        let dest_clean = clean_abs(dest);
        let (dest_dir, single_name) = match &matched[..] {
            [(_, one)] if !one.node.is_dir() && !trailing && !dest_is_dir => {
                let p = Path::new(&dest_clean);
                let name = p.file_name().map(PathBuf::from).ok_or_else(|| {
                    BuildError::bad(
                        format!("destination {dest:?}"),
                        "names no file",
                        "give a file name or a directory ending with a slash",
                    )
                })?;
                let parent = p
                    .parent()
                    .map_or("/".to_string(), |p| p.display().to_string());
                (parent, Some(name))
            }
            _ => (dest_clean.clone(), None),
        };
        for (written, src) in &matched {
            let name = single_name
                .clone()
                .unwrap_or_else(|| PathBuf::from(&src.name));
            if !self.add_source(&src.node, name, chmod, &mut entries)? {
                return Err(not_found(written));
            }
        }
        Ok(CopyPlan { dest_dir, entries })
    }

    /// Adds what copying `node` brings: a directory's contents, or the file
    /// as `name`. False when nothing of an excluded directory is brought
    /// back by an exception (Docker would not have sent it).
    fn add_source(
        &self,
        node: &Node,
        name: PathBuf,
        chmod: Option<u32>,
        out: &mut Vec<Entry>,
    ) -> Result<bool> {
        match node.file_type() {
            rustix::fs::FileType::Directory => {
                let before = out.len();
                self.walk(node, Path::new(""), chmod, 0, out)?;
                Ok(out.len() > before || !self.excluded(&node.rel, true))
            }
            rustix::fs::FileType::RegularFile => {
                out.push(self.entry(node, name, chmod, true)?);
                Ok(true)
            }
            _ => Err(BuildError::bad(
                self.tree.show(&node.rel).display().to_string(),
                "not a file or a directory",
                "copy files and directories only (or exclude it in .dockerignore)",
            )),
        }
    }

    /// Adds the included entries below the directory `dir` as `under/...`.
    fn walk(
        &self,
        dir: &Node,
        under: &Path,
        chmod: Option<u32>,
        depth: usize,
        out: &mut Vec<Entry>,
    ) -> Result<()> {
        let shown = self.tree.show(&dir.rel);
        if depth > MAX_DEPTH {
            return Err(too_deep(&shown));
        }
        let names = self.tree.list(dir).map_err(|e| BuildError::io(&shown, e))?;
        for n in names {
            if n.to_str().is_none() {
                return Err(BuildError::bad(
                    format!("{}", shown.join(&n).display()),
                    "the name is not UTF-8",
                    "rename it or exclude it in .dockerignore",
                ));
            }
            let child = self
                .tree
                .child(dir, &n)
                .map_err(|e| BuildError::io(&shown.join(&n), e))?;
            let is_dir = child.is_dir();
            let name = under.join(&n);
            if self.excluded(&child.rel, is_dir) {
                if is_dir && self.ignore.may_reinclude_below(&child.rel) {
                    // Only what an exception brings back is copied; its
                    // parent dirs come along.
                    let mut inner = Vec::new();
                    self.walk(&child, &name, chmod, depth + 1, &mut inner)?;
                    if !inner.is_empty() {
                        out.push(self.entry(&child, name, chmod, false)?);
                        out.extend(inner);
                    }
                }
                continue;
            }
            if is_special(child.file_type()) {
                continue;
            }
            out.push(self.entry(&child, name.clone(), chmod, false)?);
            if is_dir {
                self.walk(&child, &name, chmod, depth + 1, out)?;
            }
        }
        Ok(())
    }

    fn entry(&self, node: &Node, name: PathBuf, chmod: Option<u32>, top: bool) -> Result<Entry> {
        use rustix::fs::FileType;
        let kind = match node.file_type() {
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink(
                node.read_link()
                    .map_err(|e| BuildError::io(&self.tree.show(&node.rel), e))?,
            ),
            _ => Kind::File {
                size: u64::try_from(node.stat.st_size).unwrap_or(0),
            },
        };
        let mode = match (&kind, chmod) {
            (Kind::Symlink(_), _) => 0o777,
            (_, Some(m)) => m,
            _ => node.stat.st_mode & 0o7777,
        };
        Ok(Entry {
            name,
            src: Src {
                tree: self.tree.clone(),
                rel: node.rel.clone(),
                seen: Seen::of(&node.stat),
            },
            kind,
            mode,
            mtime: u64::try_from(node.stat.st_mtime).unwrap_or(0),
            top,
        })
    }

    /// Makes at `dst` (which must not exist, in a private directory) a copy
    /// of the context's `source` as `RUN --mount=type=bind` shows it: looked
    /// up as a `COPY` source is, `.dockerignore` applied. Returns the hash
    /// of what was copied, read in the same pass.
    pub fn copy_out(&self, source: &str, dst: &Path) -> Result<String> {
        let rel = clean_rel(source);
        let not_found = || {
            BuildError::bad(
                format!("--mount source {source:?}"),
                "not in the build context (or excluded by .dockerignore)",
                "check the path, relative to the context directory",
            )
        };
        let node = self.resolve(&rel, source)?.ok_or_else(not_found)?;
        let mut entries = Vec::new();
        if !self.add_source(&node, PathBuf::new(), None, &mut entries)? {
            return Err(not_found());
        }
        let plan = CopyPlan {
            dest_dir: "/".into(),
            entries,
        };
        let hash = plan.content_hash()?;
        plan.write_to(dst, node.is_dir().then_some(node.stat.st_mode & 0o7777))
            .map_err(|e| BuildError::io(dst, e))?;
        Ok(hash)
    }
}

/// Sockets, fifos and devices are not copied (as Docker's context).
fn is_special(ft: rustix::fs::FileType) -> bool {
    use rustix::fs::FileType;
    matches!(
        ft,
        FileType::Socket | FileType::Fifo | FileType::CharacterDevice | FileType::BlockDevice
    )
}

fn lookup_error(written: &str, e: &LookupError) -> BuildError {
    BuildError::bad(
        format!("source {written:?}"),
        format!("cannot be looked up in the build context: {e}"),
        "fix the symlinks on its way",
    )
}

fn too_deep(p: &Path) -> BuildError {
    BuildError::bad(
        p.display().to_string(),
        format!("directories nest deeper than {MAX_DEPTH}"),
        "exclude it in .dockerignore",
    )
}

/// Reads all of `src` into `sink`, checking afterwards that it did not
/// change while it was read. Errors do not name the file.
fn read_src(src: &Src, mut sink: impl FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
    let mut f = src.tree.open_file(&src.rel, &src.seen)?;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sink(&buf[..n])?;
    }
    src.tree.check(&f, &src.seen)
}

impl CopyPlan {
    /// A hash of everything the copy writes: names, types, modes, bytes
    /// and link targets (not mtimes, as Docker's cache does not either).
    pub fn content_hash(&self) -> Result<String> {
        let mut h = Sha256::new();
        h.update(self.dest_dir.as_bytes());
        h.update([0]);
        for e in &self.entries {
            h.update(e.name.as_os_str().as_encoded_bytes());
            h.update([0]);
            h.update(e.mode.to_le_bytes());
            match &e.kind {
                Kind::Dir => h.update(b"d"),
                Kind::Symlink(t) => {
                    h.update(b"l");
                    h.update(t.as_os_str().as_encoded_bytes());
                }
                Kind::File { size } => {
                    h.update(b"f");
                    h.update(size.to_le_bytes());
                    read_src(&e.src, |b| {
                        h.update(b);
                        Ok(())
                    })
                    .map_err(|err| BuildError::io(&e.src.shown(), err))?;
                }
            }
            h.update([0]);
        }
        Ok(hex::encode(h.finalize()))
    }

    /// Writes the entries as a tar stream of relative names.
    pub fn write_tar(&self, out: impl Write) -> std::io::Result<()> {
        let mut b = tar::Builder::new(out);
        for e in &self.entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(e.mode);
            h.set_mtime(e.mtime);
            h.set_uid(0);
            h.set_gid(0);
            match &e.kind {
                Kind::Dir => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, &e.name, std::io::empty())?;
                }
                Kind::Symlink(t) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, &e.name, t)?;
                }
                Kind::File { size } => {
                    let f = e.src.open()?;
                    h.set_size(*size);
                    h.set_entry_type(tar::EntryType::Regular);
                    // Exactly `size` bytes whatever happens to the file (a
                    // change is caught just after), holes kept: a sparse
                    // file of another stage (`COPY --from`) stays sparse.
                    sifbox_engine::transfer::sparse::append_file(
                        &mut b, &mut h, &e.name, &f, *size,
                    )?;
                    e.src.check(&f)?;
                }
            }
        }
        b.into_inner()?.flush()
    }

    /// Writes the entries as files at `dst` (a directory of `dir_mode`, or
    /// the one file when `dir_mode` is `None`), which must not exist.
    /// Modes are kept, owners are the caller's.
    fn write_to(&self, dst: &Path, dir_mode: Option<u32>) -> std::io::Result<()> {
        use cap_std::fs::{Dir, OpenOptions, Permissions};
        use std::os::unix::fs::PermissionsExt;
        let parent = dst.parent().unwrap_or(Path::new("/"));
        let base = dst
            .file_name()
            .ok_or_else(|| std::io::Error::other("names no file"))?;
        let pdir = Dir::open_ambient_dir(parent, cap_std::ambient_authority())?;
        let write_file = |dir: &Dir, name: &Path, e: &Entry| -> std::io::Result<()> {
            let mut out = dir.open_with(name, OpenOptions::new().write(true).create_new(true))?;
            read_src(&e.src, |b| out.write_all(b)).map_err(|err| e.src.named(err))?;
            out.set_permissions(Permissions::from_std(std::fs::Permissions::from_mode(
                e.mode,
            )))
        };
        let Some(mode) = dir_mode else {
            return match self.entries.as_slice() {
                [e] => write_file(&pdir, Path::new(base), e),
                _ => Err(std::io::Error::other("a file source copies one file")),
            };
        };
        pdir.create_dir(base)?;
        let dir = pdir.open_dir(base)?;
        // Directories are writable while they fill; their modes are set
        // last, deepest first.
        let mut dirs = Vec::new();
        for e in &self.entries {
            match &e.kind {
                Kind::Dir => {
                    dir.create_dir(&e.name)?;
                    dir.set_permissions(
                        &e.name,
                        Permissions::from_std(std::fs::Permissions::from_mode(0o700)),
                    )?;
                    dirs.push((e.name.clone(), e.mode));
                }
                Kind::Symlink(t) => dir.symlink_contents(t, &e.name)?,
                Kind::File { .. } => write_file(&dir, &e.name, e)?,
            }
        }
        for (name, mode) in dirs.iter().rev() {
            dir.set_permissions(
                name,
                Permissions::from_std(std::fs::Permissions::from_mode(*mode)),
            )?;
        }
        pdir.set_permissions(
            base,
            Permissions::from_std(std::fs::Permissions::from_mode(mode)),
        )
    }
}

/// `p` made relative and clean: no leading `/`, no `.`, `..` never above
/// the root.
pub fn clean_rel(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in Path::new(p).components() {
        match c {
            Component::Normal(n) => parts.push(n.to_str().unwrap_or_default()),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts.join("/")
}

/// `p` as a clean absolute path.
pub fn clean_abs(p: &str) -> String {
    format!("/{}", clean_rel(p))
}

fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

#[cfg(test)]
mod tests {
    //! A hostile context: symlinks out of it (absolute, `..`), loops, an
    //! alias of the root beside an excluded secret. Whatever is asked,
    //! nothing of the decoy outside may be planned, hashed or written.

    use super::*;
    use std::os::unix::fs::symlink;

    const MARKER: &str = "DECOY-OUTSIDE-THE-CONTEXT-7f3a";
    /// The content of the context's own `secret`, which .dockerignore
    /// excludes.
    const IGNORED: &str = "IGNORED-SECRET-c41d";

    struct Hostile {
        _dir: tempfile::TempDir,
        ctx: PathBuf,
        decoy: PathBuf,
    }

    /// `outer/decoy/{secret,sub/secret}` hold the marker; `outer/ctx` is
    /// the context.
    fn hostile() -> Hostile {
        let dir = tempfile::tempdir().expect("tempdir");
        let decoy = dir.path().join("decoy");
        let ctx = dir.path().join("ctx");
        std::fs::create_dir_all(decoy.join("sub")).expect("mkdir");
        std::fs::write(decoy.join("secret"), MARKER).expect("write");
        std::fs::write(decoy.join("sub/secret"), MARKER).expect("write");
        std::fs::write(dir.path().join("secret"), MARKER).expect("write");
        std::fs::create_dir_all(ctx.join("dir/deep")).expect("mkdir");
        std::fs::create_dir_all(ctx.join("sub")).expect("mkdir");
        std::fs::write(ctx.join("a.txt"), "A\n").expect("write");
        std::fs::write(ctx.join("secret"), IGNORED).expect("write");
        std::fs::write(ctx.join("sub/secret"), "inside\n").expect("write");
        std::fs::write(ctx.join("dir/deep/f"), "F\n").expect("write");
        std::fs::write(ctx.join(".dockerignore"), "secret\n").expect("write");
        // Out of the context, every way.
        symlink(&decoy, ctx.join("abs")).expect("symlink");
        symlink(decoy.join("secret"), ctx.join("abs-file")).expect("symlink");
        symlink("../../../../../../..", ctx.join("up")).expect("symlink");
        symlink("../decoy", ctx.join("dir/out")).expect("symlink");
        symlink("../../decoy/secret", ctx.join("dir/out-file")).expect("symlink");
        symlink("loop2", ctx.join("loop1")).expect("symlink");
        symlink("loop1", ctx.join("loop2")).expect("symlink");
        // Aliases inside it.
        symlink(".", ctx.join("alias")).expect("symlink");
        symlink("/", ctx.join("root")).expect("symlink");
        symlink("a.txt", ctx.join("link")).expect("symlink");
        symlink("/dir/deep", ctx.join("deep-link")).expect("symlink");
        Hostile {
            _dir: dir,
            ctx,
            decoy,
        }
    }

    /// The tar stream of a plan, its hash computed too.
    fn tar_of(plan: &CopyPlan) -> String {
        plan.content_hash().expect("hash");
        let mut out = Vec::new();
        plan.write_tar(&mut out).expect("tar");
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Plans `COPY src /dst/`: the entries (name, kind) or the error.
    fn copy(ctx: &Context, src: &str) -> std::result::Result<Vec<(String, Kind)>, String> {
        match ctx.plan_copy(&[src.to_owned()], "/dst/", true, None) {
            Ok(plan) => {
                let tar = tar_of(&plan);
                assert!(!tar.contains(MARKER), "{src}: the decoy was copied");
                assert!(
                    !tar.contains(IGNORED) || ctx.ignore.is_empty(),
                    "{src}: the excluded secret was copied"
                );
                Ok(plan
                    .entries
                    .iter()
                    .map(|e| (e.name.display().to_string(), e.kind.clone()))
                    .collect())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn names(r: &std::result::Result<Vec<(String, Kind)>, String>) -> Vec<String> {
        r.as_ref()
            .map(|v| v.iter().map(|(n, _)| n.clone()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn symlinks_out_of_the_context_reach_nothing_outside() {
        let h = hostile();
        let ctx = Context::open(&h.ctx).expect("open");
        for src in [
            "abs/secret",
            "abs/sub/secret",
            "abs",
            "abs-file",
            "up/decoy/secret",
            "up/secret",
            "dir/out/secret",
            "dir/out",
            "dir/out-file",
            "dir/out/sub",
            "../secret",
            "../decoy/secret",
            "/../decoy/secret",
        ] {
            let got = copy(&ctx, src);
            assert!(got.is_err(), "{src}: {got:?}");
        }
        // The decoy's absolute path, as a path inside the context, is not
        // there either.
        let inside = format!("root{}/secret", h.decoy.display());
        assert!(copy(&ctx, &inside).is_err());
    }

    #[test]
    fn symlinks_resolve_inside_the_context_as_if_it_were_root() {
        let h = hostile();
        let ctx = Context::open(&h.ctx).expect("open");
        // `up` clamps at the root: `up/a.txt` is the context's a.txt.
        let file = |r: std::result::Result<Vec<(String, Kind)>, String>| {
            r.map(|v| {
                v.into_iter()
                    .map(|(n, k)| (n, matches!(k, Kind::File { .. })))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            file(copy(&ctx, "up/a.txt")),
            Ok(vec![("a.txt".into(), true)])
        );
        assert_eq!(
            file(copy(&ctx, "root/sub/secret")),
            Ok(vec![("secret".into(), true)])
        );
        // A symlinked directory in the middle of the path.
        assert_eq!(
            file(copy(&ctx, "deep-link/f")),
            Ok(vec![("f".into(), true)])
        );
        assert_eq!(
            file(copy(&ctx, "alias/dir/deep/../deep/f")),
            Ok(vec![("f".into(), true)])
        );
        // The source itself a symlink: followed, copied under its own name
        // (as Docker).
        assert_eq!(file(copy(&ctx, "link")), Ok(vec![("link".into(), true)]));
        let plan = ctx
            .plan_copy(&["link".into()], "/x.txt", false, None)
            .expect("plan");
        assert_eq!(tar_of(&plan).matches("A\n").count(), 1);
        // A symlinked directory as the source: its contents.
        assert_eq!(names(&copy(&ctx, "deep-link")), ["f"]);
        // A loop is an error, not a hang.
        let err = copy(&ctx, "loop1").expect_err("a loop");
        assert!(err.contains("symlinks"), "{err}");
    }

    #[test]
    fn symlinks_inside_a_copied_directory_stay_symlinks() {
        let h = hostile();
        let ctx = Context::open(&h.ctx).expect("open");
        let got = copy(&ctx, "dir").expect("copy dir");
        let kinds: std::collections::BTreeMap<String, Kind> = got.into_iter().collect();
        assert_eq!(kinds["out"], Kind::Symlink(PathBuf::from("../decoy")));
        assert_eq!(
            kinds["out-file"],
            Kind::Symlink(PathBuf::from("../../decoy/secret"))
        );
        assert_eq!(kinds["deep"], Kind::Dir);
        // The whole context: every hostile link as a link, nothing of the
        // decoy, the loop harmless.
        let all = copy(&ctx, ".").expect("copy .");
        let kinds: std::collections::BTreeMap<String, Kind> = all.into_iter().collect();
        assert_eq!(kinds["abs"], Kind::Symlink(h.decoy.clone()));
        assert_eq!(kinds["loop1"], Kind::Symlink(PathBuf::from("loop2")));
        assert_eq!(kinds["alias"], Kind::Symlink(PathBuf::from(".")));
    }

    #[test]
    fn an_alias_does_not_bypass_dockerignore() {
        let h = hostile();
        let ctx = Context::open(&h.ctx).expect("open");
        for src in [
            "secret",
            "alias/secret",
            "alias/alias/secret",
            "root/secret",
            "up/secret",
        ] {
            let got = copy(&ctx, src);
            assert!(got.is_err(), "{src}: {got:?}");
        }
        // Copying the alias copies the context as sent: no secret in it.
        for src in [".", "alias", "root", "alias/."] {
            let got = names(&copy(&ctx, src));
            assert!(got.contains(&"a.txt".to_string()), "{src}: {got:?}");
            assert!(!got.contains(&"secret".to_string()), "{src}: {got:?}");
            assert!(got.contains(&"sub/secret".to_string()), "{src}: {got:?}");
        }
        // Globs through the alias (copy() checks the secret stays out).
        for src in [
            "alias/*",
            "alias/secre?",
            "alias/[s]ecret",
            "*/secret",
            "alias/*/secret",
        ] {
            let _ = copy(&ctx, src);
        }
        assert!(copy(&ctx, "alias/secre?").is_err());
        assert_eq!(names(&copy(&ctx, "*/secret")), ["secret"]);
        // An excluded symlink is not there, so neither is what is below it.
        let ig = Context::open(&h.ctx)
            .expect("open")
            .with_excludes(&["alias".into(), "deep-link".into()])
            .expect("excludes");
        assert!(copy(&ig, "alias/a.txt").is_err());
        assert!(copy(&ig, "deep-link/f").is_err());
        assert!(copy(&ig, "dir/deep/f").is_ok());
        // An alias to an excluded file points to nothing.
        symlink("secret", h.ctx.join("to-secret")).expect("symlink");
        assert!(copy(&ctx, "to-secret").is_err());
        let err = copy(&ctx, "to-*").expect_err("dangling match");
        assert!(err.contains("to-secret"), "{err}");
    }

    #[test]
    fn globs_do_not_walk_out_through_symlinks() {
        let h = hostile();
        let ctx = Context::open(&h.ctx).expect("open");
        for src in [
            "abs/*",
            "abs/s*",
            "abs/*/secret",
            "ab*/secret",
            "ab*/*",
            "dir/ou*/secret",
            "dir/*/secret",
            "up/*/secret",
            "*/sub/secret",
            "dir/out*",
        ] {
            // Errors (nothing matched, a match pointing outside) or plans
            // without the decoy (checked in copy()).
            let _ = copy(&ctx, src);
        }
        for src in [
            "abs/*",
            "ab*/secret",
            "dir/ou*/secret",
            "dir/*/secret",
            "dir/out*",
        ] {
            assert!(copy(&ctx, src).is_err(), "{src}");
        }
        // Globs still match inside: a matched symlink is followed inside.
        let got = names(&copy(&ctx, "*.txt"));
        assert_eq!(got, ["a.txt"]);
        let got = names(&copy(&ctx, "lin?"));
        assert_eq!(got, ["link"]);
        let got = names(&copy(&ctx, "dir/d*/f"));
        assert_eq!(got, ["f"]);
        // As BuildKit, a symlinked directory is not entered after the first
        // wildcard, even inside the context.
        assert!(copy(&ctx, "deep-lin?/f").is_err());
    }

    #[test]
    fn dockerfile_and_dockerignore_are_read_inside_the_context() {
        let h = hostile();
        std::fs::remove_file(h.ctx.join(".dockerignore")).expect("rm");
        symlink(h.decoy.join("secret"), h.ctx.join(".dockerignore")).expect("symlink");
        symlink(h.decoy.join("secret"), h.ctx.join("Dockerfile")).expect("symlink");
        // Not read, and not silently ignored either.
        let err = Context::open(&h.ctx).expect_err("a .dockerignore out of the context");
        assert!(err.to_string().contains(".dockerignore"), "{err}");
        assert!(!err.to_string().contains(MARKER), "{err}");
        std::fs::remove_file(h.ctx.join(".dockerignore")).expect("rm");
        symlink("/sub/../.dockerignore.real", h.ctx.join(".dockerignore")).expect("symlink");
        std::fs::write(h.ctx.join(".dockerignore.real"), "a.txt\n").expect("write");
        let ctx = Context::open(&h.ctx).expect("open");
        assert!(copy(&ctx, "a.txt").is_err());
        assert!(ctx.read_file("Dockerfile").expect("read").is_none());
        std::fs::remove_file(h.ctx.join("Dockerfile")).expect("rm");
        symlink("/a.txt", h.ctx.join("Dockerfile")).expect("symlink");
        assert_eq!(
            ctx.read_file("Dockerfile").expect("read").as_deref(),
            Some(&b"A\n"[..])
        );
    }

    #[test]
    fn a_bind_copy_is_the_context_as_sent() {
        let h = hostile();
        let ctx = Context::open(&h.ctx).expect("open");
        let out = tempfile::tempdir().expect("tempdir");
        let dst = out.path().join("src");
        ctx.copy_out("alias", &dst).expect("copy out");
        assert_eq!(
            std::fs::read_to_string(dst.join("a.txt")).expect("a"),
            "A\n"
        );
        assert!(!dst.join("secret").exists());
        assert_eq!(std::fs::read_link(dst.join("abs")).expect("abs"), h.decoy);
        assert_eq!(
            std::fs::read_to_string(dst.join("sub/secret")).expect("sub"),
            "inside\n"
        );
        for src in ["abs", "abs/secret", "up/decoy", "alias/secret", "dir/out"] {
            let d = out.path().join(src.replace('/', "_"));
            assert!(ctx.copy_out(src, &d).is_err(), "{src}");
            assert!(!d.exists(), "{src}");
        }
        let f = out.path().join("file");
        ctx.copy_out("deep-link/f", &f).expect("file");
        assert_eq!(std::fs::read_to_string(&f).expect("f"), "F\n");
    }

    #[test]
    fn a_file_swapped_after_the_plan_is_not_followed() {
        let h = hostile();
        let ctx = Context::open(&h.ctx).expect("open");
        let plan = ctx
            .plan_copy(&["dir".into()], "/dst/", true, None)
            .expect("plan");
        // The planned dir becomes a symlink to the decoy, with the same
        // names in it.
        std::fs::rename(h.ctx.join("dir"), h.ctx.join("dir.old")).expect("mv");
        std::fs::create_dir_all(h.decoy.join("deep")).expect("mkdir");
        std::fs::write(h.decoy.join("deep/f"), MARKER).expect("write");
        symlink(&h.decoy, h.ctx.join("dir")).expect("symlink");
        assert!(plan.content_hash().is_err());
        let mut out = Vec::new();
        assert!(plan.write_tar(&mut out).is_err());
        assert!(!String::from_utf8_lossy(&out).contains(MARKER));
    }
}
