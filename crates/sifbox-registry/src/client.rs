//! The registry HTTP API (OCI distribution spec, pull side): ping, token
//! authentication, manifests, and blobs downloaded into the store's blob
//! cache with resumption and retries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::header::{HeaderMap, ACCEPT, AUTHORIZATION, CONTENT_RANGE, RANGE, RETRY_AFTER};
use reqwest::StatusCode;
use sifbox_image::layer::{self, BlobDescriptor};
use sifbox_image::store::{self, Store};

use crate::challenge::{self, Challenge};
use crate::credentials::Credentials;
use crate::error::PullError;
use crate::progress::{BlobOutcome, Progress};
use crate::reference::Reference;

/// Manifest media types asked for, best first.
pub const ACCEPT_MANIFESTS: &str = "application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.list.v2+json, \
    application/vnd.oci.image.manifest.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json";

/// How transient failures (connection errors, 5xx, 429) are retried.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries per request, the first included.
    pub attempts: u32,
    /// Wait before the second try; doubled for each further one.
    pub base_delay: Duration,
    /// Longest wait between tries (without a Retry-After).
    pub max_delay: Duration,
    /// Longest `Retry-After` obeyed.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(4),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        exp.min(self.max_delay)
    }
}

/// What one try of a request came to (see [`RetryPolicy::run`]).
enum Try<T> {
    /// Done.
    Done(T),
    /// Failed for good.
    Fail(PullError),
    /// Failed in a way that may pass: try again after the backoff, or
    /// after `after` (a Retry-After), while tries are left; `error` when
    /// none are.
    Again {
        error: PullError,
        after: Option<Duration>,
    },
    /// Failed after getting somewhere (some bytes of a blob): try again,
    /// counting from the first try anew.
    Progressed(PullError),
    /// Try again at once, not counting this one (a fresh token was got).
    Now,
}

impl RetryPolicy {
    /// The tries of one request (see [`Tries`]).
    fn tries(&self) -> Tries<'_> {
        Tries {
            policy: self,
            attempt: 0,
        }
    }
}

/// The one retry loop of the client, as a state: each request's loop is
///
/// ```text
/// let mut tries = policy.tries();
/// loop {
///     let attempt = tries.start();
///     let t = async { ...one try... }.await;
///     if let Some(r) = tries.after(t).await { break r; }
/// }
/// ```
///
/// and what to do after a try (count it, wait the backoff or the
/// Retry-After, give up with the last error) is decided here alone.
struct Tries<'a> {
    policy: &'a RetryPolicy,
    attempt: u32,
}

impl Tries<'_> {
    /// A try begins; its number, from 1.
    fn start(&mut self) -> u32 {
        self.attempt += 1;
        self.attempt
    }

    /// What a try came to: the result when there is nothing more to try;
    /// else `None`, after waiting, to try again.
    async fn after<T>(&mut self, t: Try<T>) -> Option<Result<T, PullError>> {
        let (error, after) = match t {
            Try::Done(t) => return Some(Ok(t)),
            Try::Fail(e) => return Some(Err(e)),
            Try::Now => {
                self.attempt -= 1;
                return None;
            }
            Try::Progressed(e) => {
                self.attempt = 1;
                (e, None)
            }
            Try::Again { error, after } => (error, after),
        };
        if self.attempt >= self.policy.attempts {
            return Some(Err(error));
        }
        let wait = after
            .map(|d| d.min(self.policy.max_retry_after))
            .unwrap_or_else(|| self.policy.backoff(self.attempt));
        tracing::debug!(?wait, attempt = self.attempt, %error, "retrying");
        tokio::time::sleep(wait).await;
        None
    }
}

/// Status codes worth trying again.
fn transient_status(s: StatusCode) -> bool {
    matches!(s.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

/// Whether a request error may go away on its own (resets, refusals while
/// a registry restarts, timeouts, a body cut short).
fn transient_error(e: &reqwest::Error) -> bool {
    e.is_connect() || e.is_timeout() || e.is_body() || e.is_request() || e.is_decode()
}

/// The wait a `Retry-After` header asks for (seconds or an HTTP date).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

/// The text of an error reply: the `errors` of the distribution spec
/// (`CODE: message`), else the start of the body.
pub fn registry_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Item {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    #[derive(serde::Deserialize)]
    struct Errors {
        #[serde(default)]
        errors: Vec<Item>,
    }
    if let Ok(e) = serde_json::from_slice::<Errors>(body) {
        let parts: Vec<String> = e
            .errors
            .iter()
            .take(4)
            .map(|i| match (i.code.is_empty(), i.message.is_empty()) {
                (false, false) => format!("{}: {}", i.code, i.message),
                (false, true) => i.code.clone(),
                _ => i.message.clone(),
            })
            .collect();
        if !parts.is_empty() {
            return clean(&parts.join("; "));
        }
    }
    clean(&String::from_utf8_lossy(&body[..body.len().min(300)]))
}

/// One line of printable text.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A connection to one repository of one registry.
#[derive(Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    reference: Reference,
    creds: Option<Credentials>,
    auth: tokio::sync::Mutex<Option<String>>,
    retry: RetryPolicy,
}

/// A manifest or index as fetched.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub bytes: Vec<u8>,
    pub media_type: String,
    pub digest: layer::Digest,
}

impl Client {
    /// Connects: picks HTTPS (or plain HTTP for a loopback registry or with
    /// `insecure`, when HTTPS fails) and authenticates as the registry asks.
    pub async fn connect(
        reference: &Reference,
        creds: Option<Credentials>,
        insecure: bool,
        retry: RetryPolicy,
    ) -> Result<Client, PullError> {
        let mut b = reqwest::Client::builder()
            .user_agent(concat!("sifbox/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(8);
        if reference.is_loopback() {
            b = b.no_proxy();
        }
        if insecure {
            b = b.danger_accept_invalid_certs(true);
        }
        let http = b.build().map_err(|e| PullError::Transport {
            reference: reference.to_string(),
            what: "setting up HTTPS".into(),
            message: e.to_string(),
            attempts: 1,
        })?;
        let plain_ok = plain_http_allowed(reference, insecure);
        let host = reference.endpoint();
        let policy = retry.clone();
        {
            let mut tries = policy.tries();
            loop {
                let attempt = tries.start();
                let t = async {
                    let mut last = String::new();
                    for scheme in ["https", "http"] {
                        if scheme == "http" && !plain_ok {
                            continue;
                        }
                        let url = format!("{scheme}://{host}/v2/");
                        match http.get(&url).send().await {
                            Ok(resp) => {
                                let client = Client {
                                    http: http.clone(),
                                    base: format!("{scheme}://{host}"),
                                    reference: reference.clone(),
                                    creds: creds.clone(),
                                    auth: tokio::sync::Mutex::new(None),
                                    retry: retry.clone(),
                                };
                                return match client.after_ping(resp).await {
                                    Ok(()) => Try::Done(client),
                                    Err(e) => Try::Fail(e),
                                };
                            }
                            Err(e) => last = format!("{url}: {}", error_chain(&e)),
                        }
                    }
                    let error = if !plain_ok && !last.contains("refused") {
                        PullError::Insecure {
                            reference: reference.to_string(),
                            message: last,
                        }
                    } else {
                        PullError::Transport {
                            reference: reference.to_string(),
                            what: format!("connecting to {host}"),
                            message: last,
                            attempts: attempt,
                        }
                    };
                    Try::Again { error, after: None }
                }
                .await;
                if let Some(r) = tries.after(t).await {
                    break r;
                }
            }
        }
    }

    fn err_status(&self, what: &str, status: StatusCode, body: &[u8]) -> PullError {
        PullError::Registry {
            reference: self.reference.to_string(),
            what: what.to_string(),
            status: status.as_u16(),
            message: registry_message(body),
        }
    }

    /// A try that failed on the way (a connection, a body cut short): to
    /// be tried again when that may pass.
    fn transport_try<T>(&self, what: &str, e: &reqwest::Error, attempt: u32) -> Try<T> {
        let error = PullError::Transport {
            reference: self.reference.to_string(),
            what: what.to_string(),
            message: error_chain(e),
            attempts: attempt,
        };
        if transient_error(e) {
            Try::Again { error, after: None }
        } else {
            Try::Fail(error)
        }
    }

    /// A try the registry answered with an error status: to be tried again
    /// (after its Retry-After) when that may pass.
    fn status_try<T>(
        &self,
        what: &str,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Try<T> {
        let error = self.err_status(what, status, body);
        if transient_status(status) {
            Try::Again {
                error,
                after: retry_after(headers),
            }
        } else {
            Try::Fail(error)
        }
    }

    fn invalid(&self, message: String) -> PullError {
        PullError::Invalid {
            reference: self.reference.to_string(),
            message,
        }
    }

    async fn after_ping(&self, resp: reqwest::Response) -> Result<(), PullError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        if status == StatusCode::UNAUTHORIZED {
            let challenges = challenges_of(resp.headers());
            return self.authenticate(&challenges).await;
        }
        let body = resp.bytes().await.unwrap_or_default();
        // Some registries answer /v2/ oddly but serve the API all the same;
        // only a 404 says there is no registry API here.
        if status == StatusCode::NOT_FOUND {
            return Err(self.err_status("no registry API at /v2/", status, &body));
        }
        Ok(())
    }

    /// Answers challenges: a bearer token from the token service
    /// (anonymous, or with the credentials), or basic auth.
    async fn authenticate(&self, challenges: &[Challenge]) -> Result<(), PullError> {
        if let Some(c) = challenges.iter().find(|c| c.scheme == "bearer") {
            let token = self.fetch_token(c).await?;
            *self.auth.lock().await = Some(format!("Bearer {token}"));
            return Ok(());
        }
        if challenges.iter().any(|c| c.scheme == "basic") {
            *self.auth.lock().await = self.creds.as_ref().map(basic_header);
            return Ok(());
        }
        // No challenge we know: go on without, the request will say.
        Ok(())
    }

    async fn fetch_token(&self, c: &Challenge) -> Result<String, PullError> {
        let realm = c
            .param("realm")
            .filter(|r| r.starts_with("https://") || r.starts_with("http://"))
            .ok_or_else(|| {
                self.invalid("the registry's bearer challenge has no http(s) realm".into())
            })?;
        let mut url = reqwest::Url::parse(realm)
            .map_err(|e| self.invalid(format!("token realm {realm:?}: {e}")))?;
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = c.param("service") {
                q.append_pair("service", s);
            }
            q.append_pair(
                "scope",
                &format!("repository:{}:pull", self.reference.repository()),
            );
            if let Some(cr) = &self.creds {
                q.append_pair("account", &cr.username);
            }
        }
        let what = format!("token from {}", url.origin().ascii_serialization());
        {
            let mut tries = self.retry.tries();
            loop {
                let attempt = tries.start();
                let t = async {
                    let mut rb = self.http.get(url.clone());
                    if let Some(cr) = &self.creds {
                        rb = rb.header(AUTHORIZATION, basic_header(cr));
                    }
                    let result = match rb.send().await {
                        Ok(resp) => {
                            let status = resp.status();
                            let headers = resp.headers().clone();
                            read_capped(resp, 1 << 20)
                                .await
                                .map(|body| (status, headers, body))
                        }
                        Err(e) => Err(e),
                    };
                    match result {
                        Ok((status, _, body)) if status.is_success() => {
                            match self.token_of(&what, &body) {
                                Ok(t) => Try::Done(t),
                                Err(e) => Try::Fail(e),
                            }
                        }
                        Ok((status, headers, body)) => {
                            self.status_try(&what, status, &headers, &body)
                        }
                        Err(e) => self.transport_try(&what, &e, attempt),
                    }
                }
                .await;
                if let Some(r) = tries.after(t).await {
                    break r;
                }
            }
        }
    }

    /// The token in a token service's reply.
    fn token_of(&self, what: &str, body: &[u8]) -> Result<String, PullError> {
        #[derive(serde::Deserialize)]
        struct Token {
            #[serde(default)]
            token: String,
            #[serde(default)]
            access_token: String,
        }
        let t: Token = serde_json::from_slice(body)
            .map_err(|e| self.invalid(format!("{what}: not a token reply: {e}")))?;
        let token = if t.token.is_empty() {
            t.access_token
        } else {
            t.token
        };
        if token.is_empty()
            || !token.bytes().all(|b| b.is_ascii_graphic())
            || token.len() > 64 << 10
        {
            return Err(self.invalid(format!("{what}: no usable token in the reply")));
        }
        Ok(token)
    }

    /// Sends a GET with the current authorization; answers one new
    /// challenge (a token for this scope, an expired token); retries
    /// transient failures. Returns a response with a success status.
    async fn get(
        &self,
        path: &str,
        what: &str,
        accept: Option<&str>,
        range_from: u64,
    ) -> Result<reqwest::Response, PullError> {
        let url = format!("{}{path}", self.base);
        let mut reauthed = false;
        {
            let mut tries = self.retry.tries();
            loop {
                let attempt = tries.start();
                let t = async {
                    let mut rb = self.http.get(&url);
                    if let Some(a) = accept {
                        rb = rb.header(ACCEPT, a);
                    }
                    if range_from > 0 {
                        rb = rb.header(RANGE, format!("bytes={range_from}-"));
                    }
                    if let Some(a) = self.auth.lock().await.clone() {
                        rb = rb.header(AUTHORIZATION, a);
                    }
                    match rb.send().await {
                        Ok(resp) => {
                            let status = resp.status();
                            if status.is_success() || status == StatusCode::RANGE_NOT_SATISFIABLE {
                                return Try::Done(resp);
                            }
                            if status == StatusCode::UNAUTHORIZED && !reauthed {
                                reauthed = true;
                                let ch = challenges_of(resp.headers());
                                let had_auth = self.auth.lock().await.is_some();
                                let basic_again =
                                    ch.iter().all(|c| c.scheme == "basic") && had_auth;
                                if !ch.is_empty() && !basic_again {
                                    return match self.authenticate(&ch).await {
                                        Ok(()) => Try::Now,
                                        Err(e) => Try::Fail(e),
                                    };
                                }
                            }
                            let headers = resp.headers().clone();
                            let body = if transient_status(status) {
                                Vec::new()
                            } else {
                                read_capped(resp, 64 << 10).await.unwrap_or_default()
                            };
                            self.status_try(what, status, &headers, &body)
                        }
                        Err(e) => self.transport_try(what, &e, attempt),
                    }
                }
                .await;
                if let Some(r) = tries.after(t).await {
                    break r;
                }
            }
        }
    }

    /// Fetches a manifest or index by tag or digest, verifying it against
    /// the digest asked for (and the registry's Docker-Content-Digest).
    pub async fn manifest(&self, reference: &str) -> Result<Fetched, PullError> {
        let what = format!("manifest {reference}");
        let path = format!("/v2/{}/manifests/{reference}", self.reference.repository());
        let (headers, bytes) = {
            let mut tries = self.retry.tries();
            loop {
                let attempt = tries.start();
                let t = async {
                    let resp = match self.get(&path, &what, Some(ACCEPT_MANIFESTS), 0).await {
                        Ok(r) => r,
                        Err(e) => return Try::Fail(e),
                    };
                    let headers = resp.headers().clone();
                    match read_capped(resp, layer::MAX_MANIFEST_BYTES).await {
                        Ok(b) => Try::Done((headers, b)),
                        Err(e) => self.transport_try(&what, &e, attempt),
                    }
                }
                .await;
                if let Some(r) = tries.after(t).await {
                    break r;
                }
            }
        }?;
        if bytes.len() as u64 > layer::MAX_MANIFEST_BYTES {
            return Err(self.invalid(format!(
                "{what} is larger than {} bytes",
                layer::MAX_MANIFEST_BYTES
            )));
        }
        let digest = layer::Digest::sha256_of(&bytes);
        if reference.starts_with("sha256:") && digest.to_string() != reference {
            return Err(self.invalid(format!(
                "{what}: the registry sent a manifest with digest {digest}"
            )));
        }
        if let Some(d) = headers
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .filter(|d| d.starts_with("sha256:"))
        {
            if d != digest.to_string() {
                return Err(self.invalid(format!(
                    "{what}: the registry says its digest is {d} but its bytes give {digest}"
                )));
            }
        }
        let mut media_type = headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string())
            .unwrap_or_default();
        if media_type.is_empty() || !media_type.starts_with("application/vnd.") {
            #[derive(serde::Deserialize)]
            struct Mt {
                #[serde(rename = "mediaType", default)]
                media_type: String,
            }
            media_type = serde_json::from_slice::<Mt>(&bytes)
                .map(|m| m.media_type)
                .unwrap_or_default();
        }
        if media_type.starts_with("application/vnd.docker.distribution.manifest.v1") {
            return Err(self.invalid(format!(
                "{what}: Docker schema 1 manifests ({media_type}) are not supported"
            )));
        }
        Ok(Fetched {
            bytes,
            media_type,
            digest,
        })
    }

    /// Downloads a blob into the store's blob cache (once across
    /// processes: others wait on the blob's lock and find it there),
    /// continuing a partial download, verifying size and digest.
    pub async fn blob(
        self: &Arc<Self>,
        store: &Store,
        desc: &BlobDescriptor,
        progress: &Arc<dyn Progress>,
    ) -> Result<BlobOutcome, PullError> {
        let name = desc.digest.to_string();
        let sd = store::Digest::parse_sha256(&name)
            .ok_or_else(|| self.invalid(format!("blob {name}: only sha256 blobs are supported")))?;
        let store_err = |e: store::StoreError| PullError::Store {
            reference: self.reference.to_string(),
            source: e,
        };
        let (lock, writer) = {
            let (store, sd) = (store.clone(), sd.clone());
            let size = desc.size;
            tokio::task::spawn_blocking(move || {
                let lock = store.lock_blob(&sd)?;
                if store.has_blob(&sd) {
                    return Ok((lock, None));
                }
                let w = store.blob_writer(&sd, Some(size))?;
                Ok((lock, Some(w)))
            })
            .await
            .map_err(|e| self.invalid(format!("blob {name}: {e}")))?
            .map_err(store_err)?
        };
        let _lock = lock;
        let Some(mut w) = writer else {
            progress.blob_finished(desc, &BlobOutcome::Cached);
            return Ok(BlobOutcome::Cached);
        };
        let resumed_from = w.offset();
        progress.blob_started(desc, resumed_from);
        let started = Instant::now();
        let path = format!("/v2/{}/blobs/{name}", self.reference.repository());
        let what = format!("blob {name}");
        let mut tries = self.retry.tries();
        while w.offset() < desc.size || desc.size == 0 {
            let attempt = tries.start();
            let offset = w.offset();
            let resp = self.get(&path, &what, None, offset).await?;
            match resp.status() {
                StatusCode::PARTIAL_CONTENT => {
                    let start = resp
                        .headers()
                        .get(CONTENT_RANGE)
                        .and_then(|v| v.to_str().ok())
                        .and_then(content_range_start);
                    if start != Some(offset) {
                        w.restart().map_err(store_err)?;
                        progress.blob_restarted(desc);
                        continue;
                    }
                }
                StatusCode::RANGE_NOT_SATISFIABLE => {
                    w.restart().map_err(store_err)?;
                    progress.blob_restarted(desc);
                    continue;
                }
                _ => {
                    if offset > 0 {
                        // The server sends the whole blob again.
                        w.restart().map_err(store_err)?;
                        progress.blob_restarted(desc);
                    }
                }
            }
            let mut resp = resp;
            let before = w.offset();
            let mut cut: Option<reqwest::Error> = None;
            loop {
                match resp.chunk().await {
                    Ok(Some(chunk)) => {
                        if w.offset() + chunk.len() as u64 > desc.size {
                            w.discard();
                            return Err(self.invalid(format!(
                                "{what}: the registry sent more than the {} bytes the manifest lists",
                                desc.size
                            )));
                        }
                        w.write(&chunk).map_err(store_err)?;
                        progress.blob_bytes(desc, chunk.len() as u64);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        cut = Some(e);
                        break;
                    }
                }
            }
            if w.offset() == desc.size {
                break;
            }
            // Cut short: try again from where it stopped; a try that got
            // bytes does not count against the limit.
            let message = cut.as_ref().map_or_else(
                || {
                    format!(
                        "the connection closed after {} of {} bytes",
                        w.offset(),
                        desc.size
                    )
                },
                |e| error_chain(e),
            );
            tracing::debug!(blob = %name, offset = w.offset(), %message, "blob download interrupted");
            let error = PullError::Transport {
                reference: self.reference.to_string(),
                what: what.clone(),
                message,
                attempts: attempt,
            };
            let t = if w.offset() > before {
                Try::Progressed(error)
            } else {
                Try::Again { error, after: None }
            };
            if let Some(Err(e)) = tries.after::<()>(t).await {
                return Err(e);
            }
        }
        let bytes = w.offset() - resumed_from;
        let finished = {
            let w = w;
            tokio::task::spawn_blocking(move || w.finish())
                .await
                .map_err(|e| self.invalid(format!("blob {name}: {e}")))?
        };
        finished.map_err(|e| match e {
            e @ store::StoreError::BlobMismatch { .. } => self.invalid(e.to_string()),
            e => store_err(e),
        })?;
        let outcome = BlobOutcome::Downloaded {
            bytes,
            resumed_from,
            seconds: started.elapsed().as_secs_f64(),
        };
        progress.blob_finished(desc, &outcome);
        Ok(outcome)
    }
}

/// Plain HTTP (after HTTPS failed) only for a registry on this machine or
/// one the user called insecure.
fn plain_http_allowed(reference: &Reference, insecure: bool) -> bool {
    insecure || reference.is_loopback()
}

fn basic_header(c: &Credentials) -> String {
    let raw = format!("{}:{}", c.username, c.password);
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

fn challenges_of(h: &HeaderMap) -> Vec<Challenge> {
    h.get_all(reqwest::header::WWW_AUTHENTICATE)
        .iter()
        .flat_map(|v| challenge::parse(v.as_bytes()))
        .collect()
}

/// `bytes START-END/TOTAL` -> START.
fn content_range_start(v: &str) -> Option<u64> {
    let rest = v.trim().strip_prefix("bytes")?.trim_start();
    rest.split('-').next()?.trim().parse().ok()
}

/// Reads a whole body of at most `cap` bytes (more is cut at `cap + 1`).
async fn read_capped(mut resp: reqwest::Response, cap: u64) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(c) = resp.chunk().await? {
        out.extend_from_slice(&c);
        if out.len() as u64 > cap {
            break;
        }
    }
    Ok(out)
}

/// An error with its causes, which say what actually failed.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_headers() {
        assert_eq!(
            registry_message(
                br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{}}]}"#
            ),
            "MANIFEST_UNKNOWN: manifest unknown"
        );
        assert_eq!(registry_message(b"plain\ntext\x07"), "plain text");
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start("bytes */200"), None);
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, "3".parse().expect("header"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert(
            RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().expect("header"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO), "a past date");
        let r = |s: &str| Reference::parse(s).expect("reference");
        assert!(plain_http_allowed(&r("localhost:5000/x"), false));
        assert!(plain_http_allowed(&r("127.0.0.1:5000/x"), false));
        assert!(!plain_http_allowed(&r("registry.example:5000/x"), false));
        assert!(!plain_http_allowed(&r("debian"), false));
        assert!(plain_http_allowed(&r("registry.example:5000/x"), true));
        let p = RetryPolicy::default();
        assert_eq!(p.backoff(1), Duration::from_millis(250));
        assert_eq!(p.backoff(2), Duration::from_millis(500));
        assert_eq!(p.backoff(30), p.max_delay);
    }
}
