//! End-to-end tests of registry pulls (issue 4) against a real registry:
//! Debian's `docker-registry`, started by each test on 127.0.0.1 with its
//! storage in the test's temp dir; images made with `umoci` and pushed with
//! `skopeo`. Layers are tars made here (GNU tar) and added verbatim with
//! `umoci raw add-layer`, so whiteouts and opaque dirs are exactly what
//! the test says.
//!
//! Covered: Docker v2 and OCI manifests, a manifest list with two
//! platforms, a zstd image, a multi-layer image with whiteouts and an
//! opaque dir, a second image sharing the base (only its own layers are
//! downloaded), basic auth (--creds, $REGISTRY_AUTH_FILE, Docker's
//! config.json and a credential helper), a blob corrupted on the
//! registry's disk, the registry stopped mid-pull and restarted (the next
//! pull continues the partial blob), four concurrent pulls (each blob
//! downloaded once), and `docker://` as IMAGE in `run`.
//!
//! Missing tools fail the test with the package to install
//! (scripts/install-deps.sh installs them all).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{
    self, digest_of, free_port, host_arch, require, rootfs, run_tool, sha256, tempdir, Output,
    Store, Tree,
};

// ---------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------

/// skopeo with its files in `scratch` (a test's temp dir, gone with it):
/// an auth file of its own (without one it reads
/// /run/containers/UID/auth.json, which another user's podman or buildah
/// may have made unreadable) and its blob-info cache (else
/// ~/.local/share/containers/cache), so nothing is left behind.
fn skopeo(scratch: &Path) -> Command {
    let dir = scratch.join("skopeo");
    std::fs::create_dir_all(dir.join("data")).expect("skopeo's dir");
    let file = dir.join("auth.json");
    if !file.exists() {
        std::fs::write(&file, b"{\"auths\":{}}").expect("auth file");
    }
    let mut c = Command::new(require("skopeo", "skopeo"));
    c.env("REGISTRY_AUTH_FILE", &file)
        .env("XDG_DATA_HOME", dir.join("data"));
    c
}

// ---------------------------------------------------------------------------
// The registry
// ---------------------------------------------------------------------------

/// A docker-registry on 127.0.0.1, storage and logs in a temp dir.
struct Registry {
    dir: tempfile::TempDir,
    port: u16,
    auth: Option<(String, String)>,
    child: Option<Child>,
    generation: usize,
}

impl Registry {
    fn start() -> Registry {
        Registry::start_inner(None)
    }

    fn with_auth(user: &str, password: &str) -> Registry {
        Registry::start_inner(Some((user.to_string(), password.to_string())))
    }

    fn start_inner(auth: Option<(String, String)>) -> Registry {
        let mut r = Registry {
            dir: tempdir("sifbox-e2e-registry."),
            port: free_port(),
            auth,
            child: None,
            generation: 0,
        };
        r.launch();
        r
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    fn log_path(&self, generation: usize) -> PathBuf {
        self.dir.path().join(format!("registry-{generation}.log"))
    }

    /// Starts (or restarts, on the same port and storage) the registry and
    /// waits until it answers /v2/.
    fn launch(&mut self) {
        let bin = require("docker-registry", "docker-registry");
        let auth = match &self.auth {
            Some((user, password)) => {
                require("htpasswd", "apache2-utils");
                let file = self.dir.path().join("htpasswd");
                let line = run_tool(Command::new("htpasswd").args(["-Bbn", user, password]));
                std::fs::write(&file, line).expect("htpasswd file");
                format!(
                    "auth:\n  htpasswd:\n    realm: sifbox-test\n    path: {}\n",
                    file.display()
                )
            }
            None => String::new(),
        };
        let config = self.dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{}\n{auth}",
                self.storage().display(),
                self.port
            ),
        )
        .expect("registry config");
        self.generation += 1;
        let log = std::fs::File::create(self.log_path(self.generation)).expect("log file");
        let child = Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting docker-registry");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = http_status(self.port, "/v2/") {
                assert!(
                    status == 200 || status == 401,
                    "registry answered /v2/ with {status}"
                );
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!(
                        "docker-registry exited ({st}): {}",
                        std::fs::read_to_string(self.log_path(self.generation)).unwrap_or_default()
                    );
                }
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not answer on {} within 20 s",
                self.host()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the registry at once (SIGKILL), as a crash or a network cut.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The digests of the blobs served by GET (200 or 206), in order, from
    /// the access logs of every run of the registry.
    fn blob_gets(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|(m, path, status)| {
                m == "GET" && path.contains("/blobs/") && (*status == 200 || *status == 206)
            })
            .filter_map(|(_, path, _)| path.rsplit('/').next().map(str::to_string))
            .collect()
    }

    /// (method, path, status) of every request in the access logs.
    fn requests(&self) -> Vec<(String, String, u16)> {
        let mut out = Vec::new();
        for g in 1..=self.generation {
            let text = std::fs::read_to_string(self.log_path(g)).unwrap_or_default();
            for line in text.lines() {
                // 127.0.0.1 - - [date] "GET /v2/... HTTP/1.1" 200 123 "" "agent"
                let Some(start) = line.find("] \"") else {
                    continue;
                };
                let rest = &line[start + 3..];
                let mut it = rest.splitn(3, ' ');
                let (Some(method), Some(path), Some(after)) = (it.next(), it.next(), it.next())
                else {
                    continue;
                };
                let status = after
                    .split_once("\" ")
                    .and_then(|(_, s)| s.split(' ').next())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                out.push((method.to_string(), path.to_string(), status));
            }
        }
        out
    }

    /// The file holding a blob on the registry's disk.
    fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The status of a plain HTTP GET, or None when nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).ok()?;
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split_whitespace().nth(1)?.parse().ok()
}

// ---------------------------------------------------------------------------
// A throttling TCP proxy (to stop the registry while a pull is under way)
// ---------------------------------------------------------------------------

struct Proxy {
    port: u16,
    /// Bytes sent from the registry to the client.
    down: Arc<AtomicU64>,
    /// Bytes per second, 0 for no limit.
    rate: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: u16, rate: u64) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let down = Arc::new(AtomicU64::new(0));
        let rate = Arc::new(AtomicU64::new(rate));
        let stop = Arc::new(AtomicBool::new(false));
        let (d, r, st) = (down.clone(), rate.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    // Nothing upstream: the client sees its connection closed.
                    continue;
                };
                let (d, r) = (d.clone(), r.clone());
                let (c2, s2) = (
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                );
                std::thread::spawn(move || pump(c2, s2, None, None));
                std::thread::spawn(move || pump(server, client, Some(d), Some(r)));
            }
        });
        Proxy {
            port,
            down,
            rate,
            stop,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to` (at `rate` bytes/s when set), then closes both.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    count: Option<Arc<AtomicU64>>,
    rate: Option<Arc<AtomicU64>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let start = Instant::now();
    let mut sent = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        sent += n as u64;
        if let Some(c) = &count {
            c.fetch_add(n as u64, Ordering::SeqCst);
        }
        let r = rate.as_ref().map_or(0, |r| r.load(Ordering::SeqCst));
        if r > 0 {
            let due = Duration::from_secs_f64(sent as f64 / r as f64);
            if let Some(wait) = due.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

// ---------------------------------------------------------------------------
// Images: OCI layouts made with umoci, pushed with skopeo
// ---------------------------------------------------------------------------

/// One entry of a layer made by the test.
enum Entry<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    /// `.wh.NAME` next to `path`'s name.
    Whiteout(&'a str),
    /// `.wh..wh..opq` in the dir.
    Opaque(&'a str),
}

struct Layout {
    scratch: tempfile::TempDir,
    path: PathBuf,
    layers: usize,
}

impl Layout {
    /// A layout holding the image `tag`, its base layer added.
    fn with_base(tag: &str) -> Layout {
        let mut layout = Layout::new();
        layout.new_image(tag);
        layout.add_base(tag);
        layout
    }

    fn new() -> Layout {
        require("umoci", "umoci");
        let scratch = tempdir("sifbox-e2e-oci.");
        let path = scratch.path().join("oci");
        run_tool(Command::new("umoci").args(["init", "--layout"]).arg(&path));
        Layout {
            scratch,
            path,
            layers: 0,
        }
    }

    fn image(&self, tag: &str) -> String {
        format!("{}:{tag}", self.path.display())
    }

    fn new_image(&self, tag: &str) {
        run_tool(
            Command::new("umoci")
                .args(["new", "--image"])
                .arg(self.image(tag)),
        );
    }

    /// Adds a layer holding the tar of `dir`'s contents.
    fn add_tar_of(&mut self, tag: &str, dir: &Path) {
        self.layers += 1;
        let tar = self
            .scratch
            .path()
            .join(format!("layer{}.tar", self.layers));
        run_tool(
            Command::new("tar")
                .arg("-C")
                .arg(dir)
                .arg("-cf")
                .arg(&tar)
                .arg("."),
        );
        run_tool(
            Command::new("umoci")
                .args(["raw", "add-layer", "--image"])
                .arg(self.image(tag))
                .arg(&tar),
        );
    }

    /// Adds `tar` (uncompressed) as a layer, byte for byte.
    fn add_raw_tar(&mut self, tag: &str, tar: &[u8]) {
        self.layers += 1;
        let file = self
            .scratch
            .path()
            .join(format!("layer{}.tar", self.layers));
        std::fs::write(&file, tar).expect("layer tar");
        run_tool(
            Command::new("umoci")
                .args(["raw", "add-layer", "--image"])
                .arg(self.image(tag))
                .arg(&file),
        );
    }

    /// The test rootfs (busybox, the probe) as a layer.
    fn add_base(&mut self, tag: &str) {
        self.add_tar_of(tag, rootfs());
    }

    /// A layer with these entries.
    fn add_layer(&mut self, tag: &str, entries: &[Entry<'_>]) {
        let stage = Tree::at(
            self.scratch
                .path()
                .join(format!("stage{}", self.layers + 1)),
        );
        for e in entries {
            match e {
                Entry::File(p, data) => {
                    stage.file(p, data);
                }
                Entry::Dir(p) => {
                    stage.dir(p);
                }
                Entry::Whiteout(p) => {
                    let p = Path::new(p);
                    let name = p.file_name().expect("name").to_string_lossy();
                    let dir = p.parent().unwrap_or(Path::new(""));
                    stage.file(dir.join(format!(".wh.{name}")), b"");
                }
                Entry::Opaque(d) => {
                    stage.file(Path::new(d).join(".wh..wh..opq"), b"");
                }
            }
        }
        self.add_tar_of(tag, stage.path());
    }

    fn config(&self, tag: &str, args: &[&str]) {
        run_tool(
            Command::new("umoci")
                .arg("config")
                .arg("--image")
                .arg(self.image(tag))
                .args(args),
        );
    }

    /// Copies `tag` to the registry as `dest` (REPO:TAG), with extra
    /// skopeo flags (`--format v2s2`, `--all`, `--dest-creds`).
    fn push(&self, tag: &str, registry: &Registry, dest: &str, extra: &[&str]) {
        require("skopeo", "skopeo");
        run_tool(
            skopeo(self.scratch.path())
                .args([
                    "copy",
                    "--quiet",
                    "--insecure-policy",
                    "--dest-tls-verify=false",
                ])
                .args(extra)
                .arg(format!("oci:{}", self.image(tag)))
                .arg(format!("docker://{}/{dest}", registry.host())),
        );
    }

    /// The layer digests of `tag`'s manifest, bottom first.
    fn layer_digests(&self, tag: &str) -> Vec<String> {
        let index: serde_json::Value = serde_json::from_slice(
            &std::fs::read(self.path.join("index.json")).expect("index.json"),
        )
        .expect("index json");
        let desc = index["manifests"]
            .as_array()
            .expect("manifests")
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .expect("tag in index");
        let m: serde_json::Value =
            serde_json::from_slice(&self.blob(desc["digest"].as_str().expect("digest")))
                .expect("manifest json");
        m["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| l["digest"].as_str().expect("digest").to_string())
            .collect()
    }

    fn blob(&self, digest: &str) -> Vec<u8> {
        std::fs::read(
            self.path
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:")),
        )
        .expect("blob")
    }
}

/// The multi-layer image: the base, a layer of files, then a layer with a
/// whiteout and an opaque dir; Env, WorkingDir, Entrypoint, Cmd, Labels.
fn multi_layer(layout: &mut Layout, tag: &str) {
    layout.new_image(tag);
    layout.add_base(tag);
    layout.add_layer(
        tag,
        &[
            Entry::File("data/keep", b"kept\n"),
            Entry::File("data/gone", b"removed later\n"),
            Entry::File("opq/old", b"hidden by the opaque dir\n"),
            Entry::File("opq/sub/old2", b"also hidden\n"),
        ],
    );
    layout.add_layer(
        tag,
        &[
            Entry::Whiteout("data/gone"),
            Entry::Opaque("opq"),
            Entry::File("opq/new", b"new\n"),
            Entry::Dir("empty"),
        ],
    );
    layout.config(
        tag,
        &[
            "--config.env",
            "GREETING=hello from the registry",
            "--config.workingdir",
            "/data",
            "--config.entrypoint",
            "/bin/sh",
            "--config.entrypoint",
            "-c",
            "--config.cmd",
            "echo \"$GREETING\"; pwd; cat keep",
            "--config.label",
            "org.sifbox.test=multi",
        ],
    );
}

// ---------------------------------------------------------------------------
// sifbox with a test's own store
// ---------------------------------------------------------------------------

/// A test's store, with a home of its own.
struct Env {
    store: Store,
    home: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            store: Store::new("sifbox-e2e-cache."),
            home: tempdir("sifbox-e2e-home."),
        }
    }

    fn cmd(&self, args: &[&str]) -> harness::Invocation<'_> {
        // No credentials of the user running the tests leak in.
        self.store
            .cmd(args)
            .env("HOME", self.home.path())
            .env_remove("DOCKER_CONFIG")
            .env_remove("REGISTRY_AUTH_FILE")
            .timeout(Duration::from_secs(120))
    }

    fn sifbox(&self, args: &[&str]) -> Output {
        self.cmd(args).output()
    }

    fn pull(&self, reference: &str) -> String {
        self.sifbox(&["pull", reference]).digest()
    }
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn multi_layer_docker_v2_image_with_whiteouts_and_opaque_dirs() {
    let reg = Registry::start();
    let mut layout = Layout::new();
    multi_layer(&mut layout, "multi");
    layout.push("multi", &reg, "test/multi:1", &["--format", "v2s2"]);
    let env = Env::new();
    let reference = format!("{}/test/multi:1", reg.host());
    let out = env.sifbox(&["pull", &format!("docker://{reference}")]);
    out.success();
    let digest = digest_of(&out);
    // One line per blob when stderr is not a terminal.
    for layer in layout.layer_digests("multi") {
        out.stderr_has(&format!("{}: downloaded", &layer[..19]));
    }
    out.stderr_has(&format!("pulled {reference}"));

    // The metadata comes from the image config.
    let inspect = env.sifbox(&["image", "inspect", "--json", &reference]);
    inspect.success();
    let v = inspect.json();
    assert_eq!(v["image"]["digest"], digest.as_str());
    assert_eq!(v["config"]["env"][0], "GREETING=hello from the registry");
    assert_eq!(v["config"]["workdir"], "/data");
    assert_eq!(
        v["config"]["entrypoint"],
        serde_json::json!(["/bin/sh", "-c"])
    );
    assert_eq!(v["config"]["labels"]["org.sifbox.test"], "multi");

    // It runs: entrypoint + cmd, the env, the workdir; whiteouts applied.
    let run = env.sifbox(&["run", &format!("docker://{reference}")]);
    run.success();
    assert_eq!(run.stdout, "hello from the registry\n/data\nkept\n");
    // Arguments follow the entrypoint (`/bin/sh -c`), as with `docker run`.
    let ls = env.sifbox(&[
        "run",
        &format!("docker://{reference}"),
        "ls -a /data /opq; test -d /empty && echo empty-dir",
    ]);
    ls.success();
    assert_eq!(
        ls.stdout, "/data:\n.\n..\nkeep\n\n/opq:\n.\n..\nnew\nempty-dir\n",
        "the whiteout removed /data/gone, the opaque dir hid /opq's old entries"
    );

    // A second pull asks for the manifest only.
    let gets = reg.blob_gets().len();
    let again = env.sifbox(&["pull", &reference]);
    again.success();
    assert_eq!(digest_of(&again), digest);
    again.stderr_has("up to date");
    assert_eq!(reg.blob_gets().len(), gets, "nothing downloaded again");

    // Made again (from the cached blobs), the image has the same bytes.
    env.sifbox(&["image", "rm", &reference]).success();
    assert_eq!(env.pull(&reference), digest, "same layers, same SIF");

    // gc keeps the blob cache; gc --blobs keeps what stored images use and
    // removes the rest once the image is gone.
    let layers = layout.layer_digests("multi");
    env.sifbox(&["gc"]).success();
    env.sifbox(&["gc", "--blobs"]).success();
    assert!(layers.iter().all(|l| env.store.has_blob(l)));
    env.sifbox(&["image", "rm", &reference]).success();
    env.sifbox(&["gc", "--blobs"]).success();
    assert!(
        env.store.entries("blobs/sha256").is_empty(),
        "{:?}",
        env.store.entries("blobs/sha256")
    );
}

#[test]
fn run_pulls_a_docker_reference_on_first_use() {
    let reg = Registry::start();
    let mut layout = Layout::new();
    multi_layer(&mut layout, "m");
    layout.push("m", &reg, "test/run:latest", &[]);
    let env = Env::new();
    // No tag: latest.
    // `--entrypoint ''` drops the image's entrypoint: the command runs as
    // it is.
    let out = env.sifbox(&[
        "run",
        "--entrypoint",
        "",
        &format!("docker://{}/test/run", reg.host()),
        "cat",
        "/opq/new",
    ]);
    out.success();
    assert_eq!(out.stdout, "new\n");
    assert_eq!(env.store.entries("images").len(), 1);
    let refs = env.store.entries("refs");
    assert_eq!(refs.len(), 1, "{refs:?}");
    // The second run uses the stored image: no registry request at all.
    let before = reg.requests().len();
    env.sifbox(&[
        "run",
        &format!("docker://{}/test/run:latest", reg.host()),
        "true",
    ])
    .success();
    assert_eq!(reg.requests().len(), before);
}

#[test]
fn manifest_list_with_two_platforms() {
    let reg = Registry::start();
    let mut layout = Layout::new();
    for (tag, arch) in [("amd", "amd64"), ("arm", "arm64")] {
        layout.new_image(tag);
        layout.add_base(tag);
        let marker = format!("{arch}\n");
        layout.add_layer(tag, &[Entry::File("etc/arch", marker.as_bytes())]);
        layout.config(tag, &["--architecture", arch, "--os", "linux"]);
    }
    // An index of the two, as the layout's tag "list".
    let index_path = layout.path.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).expect("index")).expect("json");
    let find = |tag: &str| -> serde_json::Value {
        let mut d = index["manifests"]
            .as_array()
            .expect("manifests")
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .expect("tag")
            .clone();
        d.as_object_mut().expect("object").remove("annotations");
        d
    };
    let mut amd = find("amd");
    amd["platform"] = serde_json::json!({"architecture": "amd64", "os": "linux"});
    let mut arm = find("arm");
    arm["platform"] = serde_json::json!({"architecture": "arm64", "os": "linux", "variant": "v8"});
    let list = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [amd, arm],
    })
    .to_string()
    .into_bytes();
    let list_digest = format!("sha256:{}", sha256(&list));
    std::fs::write(
        layout
            .path
            .join("blobs/sha256")
            .join(list_digest.trim_start_matches("sha256:")),
        &list,
    )
    .expect("index blob");
    index["manifests"]
        .as_array_mut()
        .expect("manifests")
        .push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": list_digest,
            "size": list.len(),
            "annotations": {"org.opencontainers.image.ref.name": "list"},
        }));
    std::fs::write(&index_path, index.to_string()).expect("index.json");
    layout.push("list", &reg, "test/list:1", &["--all"]);
    // The same as a Docker manifest list.
    layout.push(
        "list",
        &reg,
        "test/list:docker",
        &["--all", "--format", "v2s2"],
    );

    let env = Env::new();
    let reference = format!("{}/test/list:1", reg.host());
    let host = env.pull(&reference);
    let arm = {
        env.sifbox(&["pull", "--platform", "linux/arm64", &reference])
            .digest()
    };
    assert_ne!(host, arm);
    let cat = |d: &str| {
        let out = env.sifbox(&["run", d, "cat", "/etc/arch"]);
        out.success();
        out.stdout.trim().to_string()
    };
    assert_eq!(cat(&host), host_arch());
    assert_eq!(cat(&arm), "arm64");
    let docker_arm = {
        env.sifbox(&[
            "pull",
            "--platform",
            "linux/arm64/v8",
            &format!("{}/test/list:docker", reg.host()),
        ])
        .digest()
    };
    assert_eq!(cat(&docker_arm), "arm64");
    // By digest of the index, for the host: the image pulled first.
    let by_digest = env.pull(&format!("{}/test/list@{list_digest}", reg.host()));
    assert_eq!(by_digest, host);
    let none = env
        .cmd(&["pull", "-q", "--platform", "linux/s390x", &reference])
        .output();
    none.sifbox_error()
        .stderr_has("no manifest for platform linux/s390x")
        .stderr_has("linux/arm64/v8");
    env.cmd(&["pull", "-q", "--platform", "linux", &reference])
        .output()
        .sifbox_error()
        .stderr_has("--platform");
}

#[test]
fn zstd_layers() {
    let reg = Registry::start();
    let mut layout = Layout::new();
    multi_layer(&mut layout, "gz");
    // skopeo recompresses into a second layout, then pushes that as it is.
    let zstd_dir = layout.scratch.path().join("zstd");
    run_tool(
        skopeo(layout.scratch.path())
            .args([
                "copy",
                "--quiet",
                "--insecure-policy",
                "--dest-compress-format",
                "zstd",
            ])
            .arg(format!("oci:{}", layout.image("gz")))
            .arg(format!("oci:{}:z", zstd_dir.display())),
    );
    run_tool(
        skopeo(layout.scratch.path())
            .args([
                "copy",
                "--quiet",
                "--insecure-policy",
                "--dest-tls-verify=false",
            ])
            .arg(format!("oci:{}:z", zstd_dir.display()))
            .arg(format!("docker://{}/test/zstd:1", reg.host())),
    );
    // skopeo kept its blob-info cache in the test's scratch dir, not in
    // the user's home (issue 26: tests left it in ~/.local/share). Root's
    // skopeo uses the system's /var/lib/containers/cache whatever it is told.
    assert!(
        harness::is_root()
            || layout
                .scratch
                .path()
                .join("skopeo/data/containers/cache")
                .is_dir(),
        "skopeo's cache is not in the scratch dir"
    );
    let env = Env::new();
    let digest = env.pull(&format!("{}/test/zstd:1", reg.host()));
    let zstd_blobs = env
        .store
        .entries("blobs/sha256")
        .iter()
        .filter(|h| {
            let mut magic = [0u8; 4];
            std::fs::File::open(env.store.path().join("blobs/sha256").join(h))
                .and_then(|mut f| f.read_exact(&mut magic))
                .is_ok()
                && magic == [0x28, 0xb5, 0x2f, 0xfd]
        })
        .count();
    assert_eq!(zstd_blobs, 3, "the three layers arrived zstd-compressed");
    let out = env.sifbox(&["run", &digest, "cat /data/keep /opq/new"]);
    out.success();
    assert_eq!(out.stdout, "kept\nnew\n");
}

#[test]
fn a_second_image_downloads_only_its_own_layers() {
    let reg = Registry::start();
    let mut layout = Layout::with_base("a");
    layout.add_layer("a", &[Entry::File("a.txt", b"a\n")]);
    layout.push("a", &reg, "test/a:1", &[]);
    layout.add_layer("a", &[Entry::File("b.txt", b"b\n")]);
    layout.push("a", &reg, "test/b:1", &[]);
    let layers_b = layout.layer_digests("a");
    assert_eq!(layers_b.len(), 3);

    let env = Env::new();
    env.pull(&format!("{}/test/a:1", reg.host()));
    let before = reg.blob_gets().len();
    let out = env.sifbox(&["pull", &format!("{}/test/b:1", reg.host())]);
    out.success();
    let fetched: Vec<String> = reg.blob_gets()[before..].to_vec();
    assert_eq!(
        fetched.len(),
        2,
        "only b's config and its own layer: {fetched:?}"
    );
    assert!(fetched.contains(&layers_b[2]), "{fetched:?}");
    assert!(!fetched.contains(&layers_b[0]) && !fetched.contains(&layers_b[1]));
    out.stderr_has(&format!("{}: cached", &layers_b[0][..19]));
    out.stderr_has("2 blobs downloaded");
    let run = env.sifbox(&[
        "run",
        &format!("docker://{}/test/b:1", reg.host()),
        "cat",
        "/a.txt",
        "/b.txt",
    ]);
    run.success();
    assert_eq!(run.stdout, "a\nb\n");
}

#[test]
fn private_registry_behind_basic_auth() {
    let reg = Registry::with_auth("alice", "s3cret pass");
    let mut layout = Layout::with_base("p");
    layout.add_layer("p", &[Entry::File("secret.txt", b"private\n")]);
    layout.push(
        "p",
        &reg,
        "private/img:1",
        &["--dest-creds", "alice:s3cret pass"],
    );
    let reference = format!("{}/private/img:1", reg.host());

    // Anonymous: refused, with what to do.
    let env = Env::new();
    env.cmd(&["pull", "-q", &reference])
        .output()
        .sifbox_error()
        .stderr_has(&reference)
        .stderr_has("401")
        .stderr_has("UNAUTHORIZED")
        .stderr_has("--creds");
    env.cmd(&["pull", "-q", "--creds", "alice:wrong", &reference])
        .output()
        .sifbox_error()
        .stderr_has("401");
    env.cmd(&["pull", "-q", "--creds", "nocolon", &reference])
        .output()
        .sifbox_error()
        .stderr_has("USER:PASSWORD");
    assert!(env.store.entries("images").is_empty());

    let check = |env: &Env, inv: harness::Invocation<'_>| {
        let out = inv.output();
        out.success();
        let d = digest_of(&out);
        let run = env.sifbox(&["run", &d, "cat", "/secret.txt"]);
        run.success();
        assert_eq!(run.stdout, "private\n");
    };
    // --creds
    check(
        &env,
        env.cmd(&["pull", "--creds", "alice:s3cret pass", &reference]),
    );

    // $REGISTRY_AUTH_FILE (containers-auth.json).
    let files = tempdir("sifbox-e2e-auth.");
    let auth_file = files.path().join("auth.json");
    std::fs::write(
        &auth_file,
        serde_json::json!({"auths": {reg.host(): {"auth": base64_encode("alice:s3cret pass")}}})
            .to_string(),
    )
    .expect("auth file");
    let env2 = Env::new();
    check(
        &env2,
        env2.cmd(&["pull", &reference])
            .env("REGISTRY_AUTH_FILE", &auth_file),
    );

    // ~/.docker/config.json with username and password.
    let env3 = Env::new();
    std::fs::create_dir_all(env3.home.path().join(".docker")).expect("mkdir");
    std::fs::write(
        env3.home.path().join(".docker/config.json"),
        serde_json::json!({"auths": {format!("http://{}", reg.host()): {"username": "alice", "password": "s3cret pass"}}})
            .to_string(),
    )
    .expect("config.json");
    check(&env3, env3.cmd(&["pull", &reference]));

    // A credential helper named in $DOCKER_CONFIG/config.json.
    let env4 = Env::new();
    let bin = files.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let helper = bin.join("docker-credential-sifboxtest");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\nread server\n[ \"$1\" = get ] && [ \"$server\" = \"{}\" ] || exit 1\necho '{{\"ServerURL\":\"'\"$server\"'\",\"Username\":\"alice\",\"Secret\":\"s3cret pass\"}}'\n",
            reg.host()
        ),
    )
    .expect("helper");
    harness::set_mode(&helper, 0o755);
    let docker_config = files.path().join("docker");
    std::fs::create_dir_all(&docker_config).expect("mkdir");
    std::fs::write(
        docker_config.join("config.json"),
        serde_json::json!({"credHelpers": {reg.host(): "sifboxtest"}}).to_string(),
    )
    .expect("config.json");
    let path = format!("{}:/usr/bin:/bin", bin.display());
    check(
        &env4,
        env4.cmd(&["pull", &reference])
            .env("DOCKER_CONFIG", &docker_config)
            .env("PATH", &path),
    );
}

fn base64_encode(s: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A ustar of `names` below `dir`, in that order (GNU tar, no recursion,
/// owned by root), and where each entry ends: (end of its body, end of
/// its padding).
fn ustar(dir: &Path, names: &[&str]) -> (Vec<u8>, Vec<(usize, usize)>) {
    let file = dir.with_extension("tar");
    run_tool(
        Command::new("tar")
            .args(["--format=ustar", "--no-recursion", "--numeric-owner"])
            .args(["--owner=0", "--group=0", "-C"])
            .arg(dir)
            .arg("-cf")
            .arg(&file)
            .args(names),
    );
    let tar = std::fs::read(&file).expect("the tar");
    let mut ends = Vec::new();
    let mut at = 0;
    while at + 512 <= tar.len() && tar[at..at + 512].iter().any(|b| *b != 0) {
        let field = String::from_utf8_lossy(&tar[at + 124..at + 135]).into_owned();
        let size = usize::from_str_radix(field.trim_matches(|c| c == '\0' || c == ' '), 8)
            .expect("octal size");
        let body = at + 512 + size;
        let padded = body.div_ceil(512) * 512;
        ends.push((body, padded));
        at = padded;
    }
    assert_eq!(ends.len(), names.len(), "one header per name");
    (tar, ends)
}

/// The uncompressed bytes of a gzip blob of the layout.
fn gunzip(layout: &Layout, digest: &str) -> Vec<u8> {
    let blob = layout
        .path
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    let out = Command::new("gzip")
        .arg("-dc")
        .stdin(std::fs::File::open(blob).expect("blob"))
        .output()
        .expect("gzip -dc");
    assert!(out.status.success(), "gzip -dc {digest}");
    out.stdout
}

#[test]
fn layers_ending_right_after_an_entry_pull_and_run() {
    // As Go's archive/tar reads them (containerd, Docker): one layer stops
    // right after its last entry's body, without the padding to 512 bytes
    // or the end-of-archive blocks (what umoci 0.4.7 writes for small
    // trees); another stops at an entry boundary without the end blocks.
    let reg = Registry::start();
    let mut layout = Layout::with_base("t");
    let stage = Tree::at(layout.scratch.path().join("stage-cut"));
    stage.file("cut/big", [b'b'; 700]);
    stage.file("cut/last", b"hello, umoci\n");
    stage.file("edge/x", b"at a header boundary\n");
    let (tar, ends) = ustar(stage.path(), &["cut", "cut/big", "cut/last"]);
    let (body_end, padded) = ends[2];
    assert!(body_end < padded, "the last body needs padding");
    let no_padding = tar[..body_end].to_vec();
    layout.add_raw_tar("t", &no_padding);
    let (tar, ends) = ustar(stage.path(), &["edge", "edge/x"]);
    let no_end_blocks = tar[..ends[1].1].to_vec();
    layout.add_raw_tar("t", &no_end_blocks);
    // umoci stored them as they are.
    let digests = layout.layer_digests("t");
    assert_eq!(gunzip(&layout, &digests[1]), no_padding);
    assert_eq!(gunzip(&layout, &digests[2]), no_end_blocks);
    layout.push("t", &reg, "test/cut:1", &[]);

    let env = Env::new();
    let digest = env.pull(&format!("{}/test/cut:1", reg.host()));
    let out = env.sifbox(&[
        "run",
        &digest,
        "sh",
        "-c",
        "cat /cut/last /edge/x; wc -c < /cut/big",
    ]);
    out.success();
    assert_eq!(
        out.stdout.split_whitespace().collect::<Vec<_>>().join(" "),
        "hello, umoci at a header boundary 700"
    );
}

/// A layer whose last body is really shorter than its header says is
/// still refused, naming the layer and what is wrong; nothing is stored.
#[test]
fn a_layer_cut_inside_an_entry_body_is_refused() {
    let reg = Registry::start();
    let mut layout = Layout::with_base("t");
    let stage = Tree::at(layout.scratch.path().join("stage-short"));
    stage.file("short/big", [b'b'; 700]);
    let (tar, ends) = ustar(stage.path(), &["short", "short/big"]);
    layout.add_raw_tar("t", &tar[..ends[1].0 - 100]);
    layout.push("t", &reg, "test/short:1", &[]);
    let env = Env::new();
    let out = env.sifbox(&["pull", &format!("{}/test/short:1", reg.host())]);
    out.code_is(harness::SIFBOX_ERROR)
        .stderr_has("layer 2 of 2")
        .stderr_has("short/big");
    assert!(env.store.entries("images").is_empty());
    assert!(env.store.entries("refs").is_empty());
}

#[test]
fn a_blob_corrupted_on_the_registry_is_rejected() {
    let reg = Registry::start();
    let mut layout = Layout::new();
    multi_layer(&mut layout, "c");
    layout.push("c", &reg, "test/corrupt:1", &[]);
    let victim = layout.layer_digests("c")[0].clone();
    let data = reg.blob_data(&victim);
    let mut bytes = std::fs::read(&data).expect("blob data");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&data, &bytes).expect("corrupting");

    let env = Env::new();
    let out = env.sifbox(&["pull", &format!("{}/test/corrupt:1", reg.host())]);
    out.code_is(harness::SIFBOX_ERROR)
        .stderr_has(&format!("blob {victim}"))
        .stderr_has("nothing was stored");
    let last = out.stderr.lines().last().unwrap_or_default();
    // One line, naming the image pulled (the pull error, typed up to the
    // edge, then what to do).
    assert!(
        last.starts_with(&format!("sifbox: error: {}/test/corrupt:1: ", reg.host())),
        "{}",
        out.stderr
    );
    assert!(env.store.entries("images").is_empty());
    assert!(env.store.entries("refs").is_empty());
    assert!(!env.store.has_blob(&victim));
    // The corrupt download is gone; a sibling download that the failure
    // stopped midway keeps its partial file for the next pull (by design).
    let victim_file = victim.replace(':', "-");
    assert!(
        !env.store.entries("blobs/partial").contains(&victim_file),
        "{:?}",
        env.store.entries("blobs/partial")
    );
    assert!(
        env.store
            .entries("tmp")
            .iter()
            .all(|e| e.ends_with(".lock")),
        "{:?}",
        env.store.entries("tmp")
    );
}

#[test]
fn registry_stopped_mid_pull_then_the_next_pull_resumes() {
    let mut reg = Registry::start();
    let mut layout = Layout::with_base("big");
    // 24 MiB that do not compress.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let big: Vec<u8> = (0..24 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24).to_le_bytes()[0]
        })
        .collect();
    layout.add_layer("big", &[Entry::File("big.bin", &big)]);
    layout.push("big", &reg, "test/big:1", &[]);
    let big_layer = layout.layer_digests("big")[1].clone();
    let big_size = std::fs::metadata(reg.blob_data(&big_layer))
        .expect("blob")
        .len();

    // Through a proxy at 4 MiB/s, so that the pull is still running when
    // the registry goes.
    let proxy = Proxy::start(reg.port, 4 << 20);
    let reference = format!("127.0.0.1:{}/test/big:1", proxy.port);
    let env = Env::new();
    let running = env.cmd(&["pull", &reference]).spawn();
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.down.load(Ordering::SeqCst) < 8 << 20 {
        assert!(Instant::now() < deadline, "the pull did not get going");
        std::thread::sleep(Duration::from_millis(20));
    }
    reg.kill();
    let out = running.wait();
    out.code_is(harness::SIFBOX_ERROR)
        .stderr_has(&format!("blob {big_layer}"))
        .stderr_has("attempts")
        .stderr_has("pull again");
    // Nothing partial in the store, but the partial blob is kept.
    assert!(env.store.entries("images").is_empty());
    assert!(env.store.entries("refs").is_empty());
    assert!(env.store.entries("rootfs").is_empty());
    let partial = env
        .store
        .path()
        .join("blobs/partial")
        .join(big_layer.replace(':', "-"));
    let kept = std::fs::metadata(&partial)
        .unwrap_or_else(|e| panic!("{}: {e}; stderr: {}", partial.display(), out.stderr))
        .len();
    assert!(
        kept > 4 << 20 && kept < big_size,
        "kept {kept} of {big_size}"
    );

    // Back up: the next pull continues the partial blob with a Range request.
    reg.launch();
    proxy.rate.store(0, Ordering::SeqCst);
    let before = proxy.down.load(Ordering::SeqCst);
    let out = env.sifbox(&["pull", &reference]);
    out.success();
    out.stderr_has(&format!("resuming at byte {kept}"));
    let second = proxy.down.load(Ordering::SeqCst) - before;
    assert!(
        second < big_size - kept + (1 << 20),
        "the second pull downloaded {second} bytes; {} were left",
        big_size - kept
    );
    let ranged = reg
        .requests()
        .iter()
        .any(|(m, p, s)| m == "GET" && p.ends_with(&big_layer) && *s == 206);
    assert!(ranged, "a 206 for the big layer: {:?}", reg.requests());
    assert!(env.store.entries("blobs/partial").is_empty());
    let run = env.sifbox(&["run", &digest_of(&out), "sh", "-c", "wc -c < /big.bin"]);
    run.success();
    assert_eq!(run.stdout.trim(), format!("{}", 24 << 20));
}

#[test]
fn four_concurrent_pulls_download_each_blob_once() {
    let reg = Registry::start();
    let mut layout = Layout::new();
    multi_layer(&mut layout, "cc");
    layout.push("cc", &reg, "test/concurrent:1", &[]);
    let env = Env::new();
    let reference = format!("{}/test/concurrent:1", reg.host());
    let running: Vec<_> = (0..4)
        .map(|_| env.cmd(&["pull", &reference]).spawn())
        .collect();
    let digests: Vec<String> = running.into_iter().map(|r| r.wait().digest()).collect();
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let mut gets = reg.blob_gets();
    let n = gets.len();
    gets.sort();
    gets.dedup();
    assert_eq!(
        n,
        gets.len(),
        "a blob was downloaded twice: {:?}",
        reg.blob_gets()
    );
    assert_eq!(n, 4, "config and three layers: {gets:?}");
    assert_eq!(env.store.entries("images").len(), 1);
}

#[test]
fn bad_references_and_missing_images_are_clear_errors() {
    let reg = Registry::start();
    let env = Env::new();
    env.cmd(&["pull", "Upper/Case"])
        .output()
        .sifbox_error()
        .stderr_has("lowercase");
    env.cmd(&["pull", "a@sha256:123"])
        .output()
        .sifbox_error()
        .stderr_has("64 lowercase hex digits");
    env.cmd(&["pull", "-q", &format!("{}/test/nothing:1", reg.host())])
        .output()
        .sifbox_error()
        .stderr_has(&format!("{}/test/nothing:1", reg.host()))
        .stderr_has("404")
        .stderr_has("check the repository and tag");
    env.cmd(&[
        "run",
        &format!("docker://{}/test/nothing", reg.host()),
        "true",
    ])
    .output()
    .sifbox_error()
    .stderr_has("404");
    // Nothing listening there.
    let port = free_port();
    env.cmd(&["pull", "-q", &format!("127.0.0.1:{port}/x")])
        .output()
        .sifbox_error()
        .stderr_has("connecting to");
    assert!(env.store.entries("images").is_empty());
}

#[test]
fn build_from_a_registry_image() {
    let reg = Registry::start();
    let mut layout = Layout::new();
    multi_layer(&mut layout, "m");
    layout.push("m", &reg, "test/base:1", &[]);
    let env = Env::new();
    let ctx = tempdir("sifbox-e2e-ctx.");
    std::fs::write(
        ctx.path().join("Dockerfile"),
        format!(
            "FROM {}/test/base:1\nRUN cat /opq/new > /copied\n",
            reg.host()
        ),
    )
    .expect("Dockerfile");
    let ctx_arg = ctx.path().display().to_string();
    let out = env.sifbox(&["build", "--progress", "plain", &ctx_arg]);
    out.success();
    let d = digest_of(&out);
    let run = env.sifbox(&["run", &d, "cat /copied"]);
    run.success();
    assert_eq!(run.stdout, "new\n");
    // The next build takes the pulled image from the store.
    let before = reg.requests().len();
    let again = env.sifbox(&["build", "-q", &ctx_arg]);
    again.success();
    assert_eq!(digest_of(&again), d);
    assert_eq!(reg.requests().len(), before);
}
