//! The registry client against a scripted registry on 127.0.0.1: the
//! anonymous bearer token flow, retries of 429 (with Retry-After) and 5xx,
//! a connection cut mid-blob continued with a Range request, an
//! uncompressed layer, and the registry's own messages in errors.
//!
//! The real registry (Debian's docker-registry) is driven by the
//! end-to-end tests of the sifbox binary; this one can misbehave on cue.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::Digest as _;
use sifbox_image::store::Store;
use sifbox_registry::{pull, PullError, PullOptions, Reference, RetryPolicy, Silent};

fn sha(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)))
}

/// A tar with one regular file (ustar, no compression).
fn tar_with(name: &str, body: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    let size = format!("{:011o}", body.len());
    h[124..135].copy_from_slice(size.as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(body);
    out.resize(out.len().div_ceil(512) * 512 + 1024, 0);
    out
}

struct Request {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Send only this many bytes of the body, then close.
    cut_at: Option<usize>,
}

fn reply(status: u16, body: &[u8]) -> Reply {
    Reply {
        status,
        headers: Vec::new(),
        body: body.to_vec(),
        cut_at: None,
    }
}

type Handler = dyn Fn(&Request, usize) -> Reply + Send + Sync;

/// A registry that answers each request with `handler(request, n)`, `n`
/// counting the requests for that path.
struct Mock {
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

impl Mock {
    fn start(handler: Arc<Handler>) -> Mock {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let counts = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let l2 = log.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (handler, log, counts) = (handler.clone(), l2.clone(), counts.clone());
                std::thread::spawn(move || serve(stream, &*handler, &log, &counts));
            }
        });
        Mock { port, log }
    }

    fn reference(&self, repo_tag: &str) -> Reference {
        Reference::parse(&format!("127.0.0.1:{}/{repo_tag}", self.port)).expect("reference")
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }
}

fn serve(
    stream: TcpStream,
    handler: &Handler,
    log: &Mutex<Vec<String>>,
    counts: &Mutex<HashMap<String, usize>>,
) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut stream = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        let n = {
            let mut c = counts.lock().expect("counts");
            let e = c.entry(path.clone()).or_insert(0);
            *e += 1;
            *e
        };
        let req = Request {
            method,
            path,
            headers,
        };
        let auth = req
            .headers
            .get("authorization")
            .cloned()
            .unwrap_or_default();
        let range = req.headers.get("range").cloned().unwrap_or_default();
        log.lock().expect("log").push(format!(
            "{} {} auth={auth} range={range}",
            req.method, req.path
        ));
        let r = handler(&req, n);
        let reason = match r.status {
            200 => "OK",
            206 => "Partial Content",
            401 => "Unauthorized",
            429 => "Too Many Requests",
            _ => "Status",
        };
        let mut head = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Length: {}\r\n",
            r.status,
            r.body.len()
        );
        for (k, v) in &r.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        let body = &r.body[..r.cut_at.unwrap_or(r.body.len()).min(r.body.len())];
        if stream.write_all(body).is_err() || r.cut_at.is_some() {
            let _ = stream.flush();
            return;
        }
    }
}

/// A one-layer image (uncompressed layer) and its manifest.
struct TestImage {
    manifest: Vec<u8>,
    config: Vec<u8>,
    layer: Vec<u8>,
}

fn test_image() -> TestImage {
    let body: Vec<u8> = (0..200_000u32)
        .map(|i| (i % 251).to_le_bytes()[0])
        .collect();
    let layer = tar_with("hello.bin", &body);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["A=1"], "Cmd": ["/hello"]},
        "rootfs": {"type": "layers", "diff_ids": [sha(&layer)]},
    })
    .to_string()
    .into_bytes();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": sha(&layer), "size": layer.len()}],
    })
    .to_string()
    .into_bytes();
    TestImage {
        manifest,
        config,
        layer,
    }
}

fn serve_image(img: &TestImage, req: &Request) -> Reply {
    let p = req.path.as_str();
    if p == "/v2/" {
        return reply(200, b"{}");
    }
    if p.ends_with("/manifests/latest")
        || p.ends_with(&format!("/manifests/{}", sha(&img.manifest)))
    {
        let mut r = reply(200, &img.manifest);
        r.headers.push((
            "Content-Type".into(),
            "application/vnd.oci.image.manifest.v1+json".into(),
        ));
        return r;
    }
    for blob in [&img.config, &img.layer] {
        if p.ends_with(&format!("/blobs/{}", sha(blob))) {
            let from = req
                .headers
                .get("range")
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.strip_suffix('-'))
                .and_then(|n| n.parse::<usize>().ok());
            return match from {
                Some(f) if f < blob.len() => {
                    let mut r = reply(206, &blob[f..]);
                    r.headers.push((
                        "Content-Range".into(),
                        format!("bytes {f}-{}/{}", blob.len() - 1, blob.len()),
                    ));
                    r
                }
                _ => reply(200, blob),
            };
        }
    }
    reply(
        404,
        br#"{"errors":[{"code":"NAME_UNKNOWN","message":"repository name not known to registry"}]}"#,
    )
}

fn quick_retries() -> PullOptions {
    PullOptions {
        retry: RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(100),
            max_retry_after: Duration::from_secs(5),
        },
        platform: Some("linux/amd64".parse().expect("platform")),
        ..PullOptions::default()
    }
}

fn store() -> (tempfile::TempDir, Store) {
    let t = tempfile::tempdir().expect("tempdir");
    let s = Store::open(t.path()).expect("store");
    (t, s)
}

#[test]
fn bearer_tokens_retries_and_a_cut_blob() {
    let img = Arc::new(test_image());
    let token_port = Arc::new(AtomicUsize::new(0));
    let tp = token_port.clone();
    let im = img.clone();
    let handler: Arc<Handler> = Arc::new(move |req: &Request, n: usize| {
        let port = tp.load(Ordering::SeqCst);
        if req.path.starts_with("/token") {
            assert!(
                req.path.contains("scope=repository%3Atest%2Fimg%3Apull")
                    && req.path.contains("service=mock"),
                "token request: {}",
                req.path
            );
            return reply(200, br#"{"token":"t0k3n","expires_in":300}"#);
        }
        if req.headers.get("authorization").map(String::as_str) != Some("Bearer t0k3n") {
            let mut r = reply(
                401,
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
            );
            r.headers.push((
                "WWW-Authenticate".into(),
                format!(r#"Bearer realm="http://127.0.0.1:{port}/token",service="mock",scope="repository:test/img:pull""#),
            ));
            return r;
        }
        if req.path == "/v2/" {
            return reply(200, b"{}");
        }
        if req.path.ends_with("/manifests/latest") && n <= 2 {
            // The first authorized try is throttled.
            let mut r = reply(
                429,
                br#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#,
            );
            r.headers.push(("Retry-After".into(), "1".into()));
            return r;
        }
        if req.path.ends_with(&format!("/blobs/{}", sha(&im.layer))) {
            // First a 503, then half the blob and a cut connection, then
            // the rest on a Range request.
            match n {
                1 => return reply(503, b"busy"),
                2 => {
                    let mut r = serve_image(&im, req);
                    r.cut_at = Some(im.layer.len() / 2);
                    return r;
                }
                _ => {}
            }
        }
        serve_image(&im, req)
    });
    let mock = Mock::start(handler);
    token_port.store(mock.port as usize, Ordering::SeqCst);
    let (_t, s) = store();
    let started = Instant::now();
    let pulled = pull(
        &s,
        &mock.reference("test/img"),
        &quick_retries(),
        Arc::new(Silent),
    )
    .unwrap_or_else(|e| panic!("pull: {e}\nrequests: {:#?}", mock.requests()));
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "Retry-After: 1 was obeyed"
    );
    let log = mock.requests();
    assert!(log.iter().any(|l| l.starts_with("GET /token")), "{log:#?}");
    let layer_gets: Vec<&String> = log
        .iter()
        .filter(|l| l.contains(&sha(&img.layer)) && l.contains("auth=Bearer"))
        .collect();
    assert_eq!(layer_gets.len(), 3, "503, cut, resumed: {log:#?}");
    assert!(
        layer_gets[2].contains(&format!("range=bytes={}-", img.layer.len() / 2)),
        "the third try continues where the cut left off: {log:#?}"
    );
    assert_eq!(pulled.blobs_downloaded, 2);
    assert_eq!(
        pulled.name.as_deref(),
        Some(format!("127.0.0.1:{}/test/img:latest", mock.port).as_str())
    );
    // The image is there, with the file of the uncompressed layer.
    let tree = sifbox_image::import::rootfs(&s, &pulled.digest).expect("rootfs");
    assert_eq!(
        std::fs::read(tree.join("hello.bin")).expect("file").len(),
        200_000
    );
    let meta = sifbox_image::import::image_meta(&s, &pulled.digest).expect("meta");
    assert_eq!(meta.env, ["A=1"]);
    // A second pull finds it by manifest: nothing downloaded.
    let again = pull(
        &s,
        &mock.reference("test/img"),
        &quick_retries(),
        Arc::new(Silent),
    )
    .expect("pull again");
    assert!(again.cached);
    assert_eq!(again.digest, pulled.digest);
}

#[test]
fn registry_errors_name_the_reference_and_the_message() {
    let img = Arc::new(test_image());
    let im = img.clone();
    let handler: Arc<Handler> = Arc::new(move |req: &Request, _n: usize| {
        if req.path.contains("/forbidden/") {
            return reply(
                403,
                br#"{"errors":[{"code":"DENIED","message":"requested access to the resource is denied"}]}"#,
            );
        }
        if req.path.contains("/flaky/") {
            return reply(502, b"bad gateway");
        }
        serve_image(&im, req)
    });
    let mock = Mock::start(handler);
    let (t, s) = store();
    let e = pull(
        &s,
        &mock.reference("forbidden/x"),
        &quick_retries(),
        Arc::new(Silent),
    )
    .expect_err("403");
    let msg = e.to_string();
    assert!(
        matches!(e, PullError::Registry { status: 403, .. }),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("127.0.0.1:{}/forbidden/x:latest", mock.port))
            && msg.contains("DENIED: requested access to the resource is denied"),
        "{msg}"
    );
    let e = pull(
        &s,
        &mock.reference("nothere/x:1"),
        &quick_retries(),
        Arc::new(Silent),
    )
    .expect_err("404");
    assert!(matches!(e, PullError::Registry { status: 404, .. }), "{e}");
    assert!(e.to_string().contains("NAME_UNKNOWN"), "{e}");
    let before = mock.requests().len();
    let e = pull(
        &s,
        &mock.reference("flaky/x"),
        &quick_retries(),
        Arc::new(Silent),
    )
    .expect_err("502");
    assert!(matches!(e, PullError::Registry { status: 502, .. }), "{e}");
    let tries = mock.requests()[before..]
        .iter()
        .filter(|l| l.contains("/flaky/"))
        .count();
    assert_eq!(tries, 4, "502 is retried up to the limit");
    // A single-platform image for another platform: refused after the
    // config, before any layer is downloaded.
    let before = mock.requests().len();
    let arm = PullOptions {
        platform: Some("linux/arm64".parse().expect("platform")),
        ..quick_retries()
    };
    let e = pull(&s, &mock.reference("test/img"), &arm, Arc::new(Silent)).expect_err("amd64 only");
    assert!(
        e.to_string()
            .contains("the image is for linux/amd64, not linux/arm64"),
        "{e}"
    );
    assert!(
        !mock.requests()[before..]
            .iter()
            .any(|l| l.contains(&sha(&img.layer))),
        "{:#?}",
        mock.requests()
    );
    // Nothing was stored by any of them.
    assert_eq!(s.list().expect("list").len(), 0);
    assert_eq!(
        std::fs::read_dir(t.path().join("blobs/sha256"))
            .expect("dir")
            .count(),
        1,
        "only the config checked for the platform"
    );
}

#[test]
fn a_blob_that_does_not_match_is_not_stored() {
    let img = Arc::new(test_image());
    let im = img.clone();
    let handler: Arc<Handler> = Arc::new(move |req: &Request, _n: usize| {
        let mut r = serve_image(&im, req);
        if req.path.ends_with(&format!("/blobs/{}", sha(&im.layer))) {
            let mid = r.body.len() / 2;
            r.body[mid] ^= 0xff;
        }
        r
    });
    let mock = Mock::start(handler);
    let (t, s) = store();
    let e = pull(
        &s,
        &mock.reference("test/img"),
        &quick_retries(),
        Arc::new(Silent),
    )
    .expect_err("corrupt layer");
    let msg = e.to_string();
    assert!(
        msg.contains(&sha(&img.layer)) && msg.contains("nothing was stored"),
        "{msg}"
    );
    assert!(!t
        .path()
        .join("blobs/sha256")
        .join(sha(&img.layer).trim_start_matches("sha256:"))
        .exists());
    assert_eq!(
        std::fs::read_dir(t.path().join("blobs/partial"))
            .expect("dir")
            .count(),
        0,
        "no partial file is kept for bytes that were wrong: {:?}",
        std::fs::read_dir(t.path().join("blobs/partial"))
            .expect("dir")
            .flatten()
            .map(|e| (e.file_name(), e.metadata().map(|m| m.len()).ok()))
            .collect::<Vec<_>>()
    );
    assert!(s.list().expect("list").is_empty());
}
