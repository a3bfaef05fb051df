//! Hostile tests of the layer, runnable as any user: each builds a tree
//! in a temp dir with a decoy outside it (`outside/`), attacks the layer
//! the way a sandbox could (symlinks, `..`, absolute links, hard links,
//! fifos, devices, a directory swapped mid-walk) and checks that the
//! decoy was neither reached nor changed.

use super::walk::{Entry, Step, Visitor};
use super::*;
use std::io::{Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::symlink;

struct Fixture {
    _tmp: tempfile::TempDir,
    /// The tree under attack.
    tree: PathBuf,
    /// A decoy outside it: `outside/secret` holds "decoy".
    outside: PathBuf,
    fd: OwnedFd,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = tmp.path().join("tree");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&tree).expect("tree");
    std::fs::create_dir(&outside).expect("outside");
    std::fs::write(outside.join("secret"), "decoy").expect("decoy");
    std::fs::create_dir_all(tree.join("a/b")).expect("a/b");
    std::fs::write(tree.join("a/b/file"), "inside").expect("file");
    let fd = open_dir(rustix::fs::CWD, &tree).expect("open tree");
    Fixture {
        _tmp: tmp,
        tree,
        outside,
        fd,
    }
}

impl Fixture {
    fn decoy_intact(&self) -> bool {
        std::fs::read_to_string(self.outside.join("secret"))
            .ok()
            .as_deref()
            == Some("decoy")
            && std::fs::read_dir(&self.outside).map(Iterator::count).ok() == Some(1)
    }
}

fn read_all(fd: OwnedFd) -> String {
    let mut s = String::new();
    File::from(fd).read_to_string(&mut s).expect("read");
    s
}

#[test]
fn open_beneath_opens_a_plain_path_and_the_base_itself() {
    let f = fixture();
    let fd = open_beneath(&f.fd, "a/b/file", OFlags::RDONLY).expect("plain path");
    assert_eq!(read_all(fd), "inside");
    let base = open_beneath(&f.fd, "", OFlags::PATH | OFlags::DIRECTORY).expect("the base");
    is_dir(&base).expect("a directory");
}

#[test]
fn open_beneath_refuses_dotdot_and_absolute_paths() {
    let f = fixture();
    let up = open_beneath(&f.fd, "../outside/secret", OFlags::RDONLY);
    assert_eq!(up.err(), Some(Errno::XDEV), "`..` above the base");
    let deep = open_beneath(&f.fd, "a/../../outside/secret", OFlags::RDONLY);
    assert_eq!(deep.err(), Some(Errno::XDEV), "`..` after a descent");
    let abs = f.outside.join("secret");
    assert_eq!(
        open_beneath(&f.fd, &abs, OFlags::RDONLY).err(),
        Some(Errno::XDEV),
        "an absolute path"
    );
    // `..` that stays beneath is the kernel's business and allowed.
    open_beneath(&f.fd, "a/../a/b/file", OFlags::RDONLY).expect("`..` within");
}

#[test]
fn open_beneath_refuses_symlinks_anywhere() {
    let f = fixture();
    symlink(&f.outside, f.tree.join("abs")).expect("absolute link");
    symlink("../outside", f.tree.join("rel")).expect("relative link out");
    symlink("b", f.tree.join("a/inner")).expect("link within");
    symlink("a/b/file", f.tree.join("last")).expect("link as last component");
    for path in ["abs/secret", "rel/secret", "a/inner/file", "last"] {
        let r = open_beneath(&f.fd, path, OFlags::RDONLY);
        assert_eq!(r.err(), Some(Errno::LOOP), "{path}");
    }
    // Magic links: /proc/self/root is refused as a path (absolute) and as
    // a link a sandbox planted.
    symlink("/proc/self/root", f.tree.join("magic")).expect("magic link");
    assert!(open_beneath(&f.fd, "magic/etc", OFlags::RDONLY).is_err());
    // O_PATH|O_NOFOLLOW opens the last link itself, never its target.
    let link = open_beneath(&f.fd, "abs", OFlags::PATH | OFlags::NOFOLLOW).expect("the link");
    let st = rustix::fs::fstat(&link).expect("fstat");
    assert_eq!(FileType::from_raw_mode(st.st_mode), FileType::Symlink);
    assert!(f.decoy_intact());
}

#[test]
fn open_inside_follows_links_only_while_they_stay_beneath() {
    let f = fixture();
    symlink("b/file", f.tree.join("a/alias")).expect("link within");
    symlink(f.outside.join("secret"), f.tree.join("abs")).expect("absolute link");
    symlink("../outside/secret", f.tree.join("rel")).expect("relative link out");
    let fd = open_inside(&f.fd, "a/alias", OFlags::RDONLY).expect("within");
    assert_eq!(read_all(fd), "inside");
    for path in ["abs", "rel", "../outside/secret"] {
        assert_eq!(
            open_inside(&f.fd, path, OFlags::RDONLY).err(),
            Some(Errno::XDEV),
            "{path}"
        );
    }
}

#[test]
fn reach_dir_makes_and_reaches_only_real_directories_beneath() {
    let f = fixture();
    let mut made = Vec::new();
    let fd = reach_dir(&f.fd, Path::new("a/new/deeper"), Some(&mut made)).expect("made");
    is_dir(&fd).expect("a directory");
    assert_eq!(
        made,
        [PathBuf::from("a/new"), PathBuf::from("a/new/deeper")]
    );
    assert!(f.tree.join("a/new/deeper").is_dir());

    // A symlink on the way, absolute or relative, is an error and nothing
    // is made at its target.
    symlink(&f.outside, f.tree.join("abs")).expect("link");
    symlink("../outside", f.tree.join("a/rel")).expect("link");
    for rel in ["abs/x", "a/rel/x", "abs", "a/rel"] {
        let mut made = Vec::new();
        let r = reach_dir(&f.fd, Path::new(rel), Some(&mut made));
        assert!(r.is_err(), "{rel}");
        assert!(r
            .err()
            .is_some_and(|e| e.to_string().contains("not followed")));
        assert!(made.is_empty(), "{rel}");
    }
    for rel in ["../outside", "a/../../outside", "/tmp", "./a"] {
        assert!(reach_dir(&f.fd, Path::new(rel), None).is_err(), "{rel}");
    }
    // A file where a directory should be.
    assert!(reach_dir(&f.fd, Path::new("a/b/file/x"), None).is_err());
    assert!(f.decoy_intact());
}

#[test]
fn open_dir_does_not_follow_a_directory_replaced_by_a_symlink() {
    let f = fixture();
    let held = open_dir(&f.fd, "a").expect("a");
    // The directory is moved away and a symlink to the outside takes its
    // name: a fresh open refuses it, the fd held still names the original.
    std::fs::rename(f.tree.join("a"), f.tree.join("moved")).expect("move");
    symlink(&f.outside, f.tree.join("a")).expect("swap");
    let again = open_dir(&f.fd, "a").err();
    assert!(
        matches!(again, Some(Errno::NOTDIR | Errno::LOOP)),
        "{again:?}"
    );
    assert!(open_dir_path(&f.fd, "a").is_err());
    assert_eq!(names(&held).expect("names"), [OsString::from("b")]);
    assert!(f.decoy_intact());
}

#[test]
fn names_are_sorted_without_dots_from_any_fd() {
    let f = fixture();
    std::fs::write(f.tree.join("z"), "").expect("z");
    std::fs::write(f.tree.join("0"), "").expect("0");
    let path_fd = open_dir_path(rustix::fs::CWD, &f.tree).expect("O_PATH");
    let want: Vec<OsString> = ["0", "a", "z"].iter().map(OsString::from).collect();
    assert_eq!(names(&path_fd).expect("names"), want);
    assert_eq!(names(&f.fd).expect("names"), want);
}

#[test]
fn open_regular_refuses_links_fifos_and_devices_without_blocking() {
    let f = fixture();
    symlink(f.outside.join("secret"), f.tree.join("link")).expect("link");
    let r = open_regular(&f.fd, "link");
    assert!(r.is_err(), "a symlink is not followed");
    rustix::fs::mknodat(&f.fd, "fifo", FileType::Fifo, Mode::from_raw_mode(0o600), 0)
        .expect("mkfifo");
    // No writer: a blocking open would hang here.
    let r = open_regular(&f.fd, "fifo");
    assert_eq!(r.err().map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
    // A device: /dev/null itself (making one needs CAP_MKNOD), and one
    // made in the tree where this user may.
    let r = open_regular(rustix::fs::CWD, "/dev/null");
    assert_eq!(r.err().map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
    let dev = rustix::fs::makedev(1, 3);
    if rustix::fs::mknodat(
        &f.fd,
        "null",
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o600),
        dev,
    )
    .is_ok()
    {
        let r = open_regular(&f.fd, "null");
        assert_eq!(r.err().map(|e| e.kind()), Some(io::ErrorKind::InvalidInput));
    }
    let (mut file, st) = open_regular(&f.fd, "a/b/file").expect("a file");
    assert_eq!(st.st_nlink, 1);
    let mut s = String::new();
    file.read_to_string(&mut s).expect("read");
    assert_eq!(s, "inside");
}

#[test]
fn open_regular_shows_a_hard_link_to_a_file_outside() {
    let f = fixture();
    // A hard link to the decoy (same file system): the layer cannot tell
    // where the other name is, but the count tells it there is one.
    std::fs::hard_link(f.outside.join("secret"), f.tree.join("hard")).expect("hard link");
    let (_, st) = open_regular(&f.fd, "hard").expect("opens");
    assert_eq!(st.st_nlink, 2);
}

#[test]
fn create_new_replaces_a_planted_symlink_or_hard_link_without_following() {
    let f = fixture();
    symlink(f.outside.join("secret"), f.tree.join("out")).expect("link");
    std::fs::hard_link(f.outside.join("secret"), f.tree.join("hard")).expect("hard link");
    symlink(f.outside.join("new"), f.tree.join("dangling")).expect("dangling");
    for name in ["out", "hard", "dangling"] {
        let mut file = create_new(&f.fd, name, Mode::from_raw_mode(0o600)).expect(name);
        file.write_all(b"written").expect("write");
        let meta = std::fs::symlink_metadata(f.tree.join(name)).expect("meta");
        assert!(meta.is_file(), "{name}");
        assert_eq!(
            std::fs::read_to_string(f.tree.join(name)).ok().as_deref(),
            Some("written")
        );
    }
    assert!(f.decoy_intact(), "nothing written or made outside");
    std::fs::create_dir(f.tree.join("d")).expect("dir");
    assert!(create_new(&f.fd, "d", Mode::from_raw_mode(0o600)).is_err());
}

#[test]
fn clear_removes_a_link_not_its_target_and_refuses_a_directory() {
    let f = fixture();
    symlink(f.outside.join("secret"), f.tree.join("out")).expect("link");
    symlink(&f.outside, f.tree.join("outdir")).expect("dir link");
    clear(&f.fd, "out").expect("link removed");
    clear(&f.fd, "outdir").expect("dir link removed");
    clear(&f.fd, "missing").expect("nothing to do");
    assert!(clear(&f.fd, "a").is_err(), "a directory");
    assert!(f.tree.join("a").is_dir());
    assert!(f.decoy_intact());
}

/// Records the paths the walk sees; at `swap_at` it moves that directory
/// away and puts a symlink to `outside` in its place, as a sandbox racing
/// the walk would.
struct Swapper {
    tree: PathBuf,
    outside: PathBuf,
    swap_at: &'static str,
    seen: Vec<PathBuf>,
}

impl Visitor for Swapper {
    fn entry(&mut self, e: &Entry<'_>) -> io::Result<Step> {
        self.seen.push(e.path.to_path_buf());
        if e.path == Path::new(self.swap_at) {
            let at = self.tree.join(self.swap_at);
            std::fs::rename(&at, self.tree.join("moved-away")).expect("move");
            symlink(&self.outside, &at).expect("swap");
        }
        Ok(Step::Descend)
    }
}

#[test]
fn walk_does_not_follow_a_directory_swapped_for_a_symlink_mid_walk() {
    let f = fixture();
    let mut v = Swapper {
        tree: f.tree.clone(),
        outside: f.outside.clone(),
        swap_at: "a",
        seen: Vec::new(),
    };
    walk(f.fd.as_fd(), walk::Options::default(), &mut v).expect("walk");
    assert!(
        !v.seen.iter().any(|p| p.ends_with("secret")),
        "the walk went outside: {:?}",
        v.seen
    );
    assert!(f.decoy_intact());
}

#[test]
fn walk_does_not_follow_symlinks_or_dotdot_links() {
    let f = fixture();
    symlink(&f.outside, f.tree.join("abs")).expect("link");
    symlink("..", f.tree.join("a/up")).expect("link");
    symlink("/", f.tree.join("a/b/root")).expect("link");
    let mut v = Swapper {
        tree: f.tree.clone(),
        outside: f.outside.clone(),
        swap_at: "(none)",
        seen: Vec::new(),
    };
    walk(f.fd.as_fd(), walk::Options::default(), &mut v).expect("walk");
    let mut seen = v.seen;
    seen.sort();
    let want: Vec<PathBuf> = ["a", "a/b", "a/b/file", "a/b/root", "a/up", "abs"]
        .iter()
        .map(PathBuf::from)
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn walk_sees_fifos_and_hard_links_as_entries_only() {
    let f = fixture();
    rustix::fs::mknodat(&f.fd, "fifo", FileType::Fifo, Mode::from_raw_mode(0o600), 0)
        .expect("mkfifo");
    std::fs::hard_link(f.outside.join("secret"), f.tree.join("hard")).expect("hard link");
    struct Kinds(Vec<(PathBuf, FileType, u64)>);
    impl Visitor for Kinds {
        fn entry(&mut self, e: &Entry<'_>) -> io::Result<Step> {
            self.0
                .push((e.path.to_path_buf(), e.file_type(), e.stat.st_nlink));
            Ok(Step::Descend)
        }
        fn leave(&mut self, _dir: BorrowedFd<'_>, _path: &Path) -> io::Result<()> {
            Ok(())
        }
    }
    let mut v = Kinds(Vec::new());
    // Opening a fifo would block: the walk only looks at it.
    walk(f.fd.as_fd(), walk::Options::default(), &mut v).expect("walk");
    assert!(v.0.contains(&(PathBuf::from("fifo"), FileType::Fifo, 1)));
    assert!(v
        .0
        .contains(&(PathBuf::from("hard"), FileType::RegularFile, 2)));
}
