//! init's exec server: one connection at a time; execs and transfers go
//! to the worker pool (what would change a worker for good to a process of
//! its own); init reaps every orphan.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, WaitOptions};

use super::exit_now;
use super::handoff::{Activity, KeptLayer};
use super::pool::{self, new_worker, NewWorker, Pool};
use sifbox_sys::syscall::{Kernel, Syscall};

use crate::protocol::{self, Event, ExecRequest, Request};
use crate::spec::Confinement;
use crate::{transfer, worker};

/// A worker's life: jobs arrive on `chan`, each a request ([`pooled`])
/// with the client's connection as the first fd and the request's own fds
/// after it; it ends when init closes the channel.
fn worker_main(chan: &UnixStream, confinement: Confinement) -> i32 {
    loop {
        // No trim here: the pages of the exec path are what make the next
        // exec fast, also after an agent thought for a while.
        let Ok((req, mut fds)) = protocol::recv::<Request>(chan) else {
            return 0;
        };
        if fds.is_empty() || !pooled(&req) {
            return 125;
        }
        let conn = UnixStream::from(fds.remove(0));
        serve_in_child(&conn, req, fds, confinement);
        drop(conn);
        if rustix::io::write(chan, b"d").is_err() {
            return 0;
        }
    }
}

/// How long init waits idle before it gives back the pages that serving
/// touched (see [`trim`]).
const IDLE_TRIM: Duration = Duration::from_secs(2);

/// How long a new sandbox waits idle before its first [`trim`].
const FIRST_TRIM: Duration = Duration::from_secs(1);

/// Gives back freed heap and the mapped pages of code that an idle process
/// does not need; the next request faults in what it uses again.
pub(super) fn trim() {
    sifbox_sys::release_free_memory();
    sifbox_sys::drop_clean_file_pages();
}

/// Whether a request may be served by a reusable worker: an exec, unless
/// it changes the serving process for good (a seccomp filter, a network
/// namespace) or is the sandbox's last, and every transfer (they read and
/// write files, and leave the process as they found it). A transfer in a
/// worker costs no fork and no exit of a process of its own.
fn pooled(req: &Request) -> bool {
    match req {
        Request::Exec(exec) => {
            !exec.fake_ids && !exec.isolate_net && !exec.stop_after && !exec.guarded
        }
        Request::Download { .. }
        | Request::Upload { .. }
        | Request::Extract { .. }
        | Request::UploadTar { .. }
        | Request::Snapshot
        | Request::Remove { .. }
        | Request::GiveBack { .. }
        | Request::MirrorOwners { .. }
        | Request::Chown { .. } => true,
        _ => false,
    }
}

/// Whether a request is to be served in the guarded mount namespace.
fn is_guarded(req: &Request) -> bool {
    matches!(
        req,
        Request::Guarded { .. } | Request::Exec(ExecRequest { guarded: true, .. })
    )
}

/// Moves the calling process (one that serves a guarded request, or init
/// for the sandbox's last command) into the guarded mount namespace `ns`
/// (see [`crate::spec::GuardedBind`]), and unwraps the request; refused
/// where the sandbox has no guarded binds, or for a request that is not
/// a file request.
fn enter_guarded(
    sys: &dyn Syscall,
    req: Request,
    ns: Option<&OwnedFd>,
) -> std::result::Result<Request, String> {
    let req = match req {
        Request::Guarded { request } => match *request {
            inner @ (Request::Chown { .. } | Request::GiveBack { .. } | Request::Remove { .. }) => {
                inner
            }
            _ => return Err("only chown, give-back and remove can be guarded requests".into()),
        },
        other => other,
    };
    let ns = ns.ok_or("this sandbox has no guarded binds")?;
    sys.setns(
        std::os::fd::AsFd::as_fd(ns),
        Some(rustix::thread::LinkNameSpaceType::Mount),
    )
    .map_err(|e| format!("entering the guarded mount namespace: {e}"))?;
    Ok(req)
}

/// The exec server: one connection at a time; each exec and transfer is
/// served by a worker process (reused), the rest by init itself. `guarded`
/// is the guarded mount namespace, where the sandbox has guarded binds.
pub(super) fn serve(
    listener: UnixListener,
    confinement: Confinement,
    mut activity: Option<Activity>,
    mut keep: Option<KeptLayer>,
    guarded: Option<OwnedFd>,
) -> ! {
    // Before any worker is forked: they count the policy's denials into
    // what stop's reply reports.
    if confinement.seccomp != crate::spec::SeccompMode::Unconfined {
        crate::denials::share();
    }
    let sigchld = sigchld_pipe();
    let sigchld_id = sigchld.as_ref().map(|(_, id)| *id);
    let sigchld = sigchld.map(|(r, _)| r);
    // Detached execs by id, for `Signal`: the pid of the worker serving it.
    let mut detached: HashMap<String, Pid> = HashMap::new();
    let mut workers = Pool::default();
    // Execs with a time limit in a process of their own (not a worker):
    // when to rescue each, as a worker is.
    let mut oneoff: Vec<(Pid, Instant)> = Vec::new();
    // Whether anything ran since the last trim: setting up did, and the
    // first trim comes after a shorter idle time (a sandbox waiting for
    // its first command holds nothing it needs).
    let mut busy_since_trim = true;
    let mut idle_after = FIRST_TRIM;
    loop {
        let reaped = reap_finished();
        if !reaped.is_empty() {
            detached.retain(|_, p| !reaped.contains(p));
            workers.reaped(&reaped);
            oneoff.retain(|(p, _)| !reaped.contains(p));
        }
        if let Some(a) = &mut activity {
            a.check(&workers, &detached);
        }
        rescue_overdue(&mut workers, &mut oneoff);
        let Some((listener_ready, finished)) = wait_for_work(
            &listener,
            sigchld.as_ref(),
            &workers,
            &oneoff,
            &mut busy_since_trim,
            &mut idle_after,
        ) else {
            continue;
        };
        if let Some(r) = &sigchld {
            let mut drain = [0u8; 64];
            while let Ok(n) = rustix::io::read(r, &mut drain) {
                if n == 0 {
                    break;
                }
            }
        }
        for &i in finished.iter().rev() {
            if let Some(pid) = workers.finished(i) {
                detached.retain(|_, p| *p != pid);
            }
        }
        workers.trim_idle();
        if !listener_ready {
            continue;
        }
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => exit_now(125),
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
        let Ok((req, fds)) = protocol::recv::<Request>(&conn) else {
            continue;
        };
        let _ = conn.set_read_timeout(None);
        if !matches!(req, Request::Ping) {
            if let Some(a) = &mut activity {
                a.busy();
            }
        }
        let ok = || Event::Ok {
            time_ns: worker::now_ns(),
            denied: Vec::new(),
        };
        match req {
            Request::Ping => {
                let _ = protocol::send(&conn, &ok(), &[]);
            }
            Request::Stop { grace_ms } => stop_and_exit(&conn, grace_ms),
            Request::StopKeepingLayer { grace_ms } => {
                stop_keeping_layer_and_exit(&conn, grace_ms, keep.take())
            }
            Request::Signal { exec_id, signal } => {
                let reply = match detached.get(&exec_id) {
                    Some(pid) => {
                        signal_exec(*pid, signal);
                        ok()
                    }
                    None => no_such_exec(&exec_id),
                };
                let _ = protocol::send(&conn, &reply, &[]);
            }
            Request::EndProcesses => {
                let ended = end_processes(&workers, &detached, &oneoff);
                let _ = protocol::send(&conn, &Event::Ended { processes: ended }, &[]);
            }
            Request::Exec(exec) if exec.stop_after => {
                // The sandbox's last command runs right here, under PID 1,
                // which adopts whatever it leaves behind; then everything goes.
                drop((listener, activity));
                let exec = if exec.guarded {
                    match guarded_or_exit(Request::Exec(exec), guarded.as_ref(), &conn) {
                        Request::Exec(e) => e,
                        _ => exit_now(125),
                    }
                } else {
                    exec
                };
                drop(guarded);
                worker::run(&Kernel, &conn, exec, fds, confinement);
                drop(conn);
                exit_now(0);
            }
            req if pooled(&req) => {
                // Twice at most: a worker may have died (something in the
                // sandbox killed it) since init last looked.
                let mut outcome = Err(pool::PoolError::NoneFree);
                for _ in 0..2 {
                    if !workers.has_idle() {
                        match new_worker() {
                            Ok(NewWorker::Child(chan)) => {
                                // Only our own channel stays open: the
                                // client's connection and stdio come again
                                // with the job, and another worker's channel
                                // must reach EOF when init closes its end.
                                // A worker never serves a guarded request.
                                drop((
                                    listener, conn, fds, workers, sigchld, activity, keep, guarded,
                                ));
                                // The exits of a worker's commands are its
                                // own business, not a reason to wake init.
                                if let Some(id) = sigchld_id {
                                    signal_hook::low_level::unregister(id);
                                }
                                exit_now(worker_main(&chan, confinement))
                            }
                            Ok(NewWorker::Parent(w)) => workers.add(w),
                            Err(e) => {
                                outcome = Err(e);
                                break;
                            }
                        }
                    }
                    outcome = workers.dispatch(&conn, &req, &fds);
                    if outcome.is_ok() {
                        break;
                    }
                }
                note_dispatched(outcome, req, &conn, &mut detached);
            }
            other => match sifbox_sys::fork() {
                Ok(sifbox_sys::Forked::Child) => {
                    drop((listener, workers, activity, keep));
                    let req = if is_guarded(&other) {
                        guarded_or_exit(other, guarded.as_ref(), &conn)
                    } else {
                        other
                    };
                    drop(guarded);
                    exit_now(serve_in_child(&conn, req, fds, confinement))
                }
                Ok(sifbox_sys::Forked::Parent(pid)) => {
                    if let Request::Exec(exec) = other {
                        if let Some(ms) = exec.timeout_ms {
                            let limit = Duration::from_millis(ms) + pool::RESCUE_AFTER;
                            oneoff.push((pid, Instant::now() + limit));
                        }
                        if let Some(id) = exec.detach_id {
                            detached.insert(id, pid);
                        }
                    }
                }
                Err(e) => {
                    let _ = protocol::send(
                        &conn,
                        &Event::Error {
                            code: 125,
                            message: e.to_string(),
                        },
                        &[],
                    );
                }
            },
        }
    }
}

/// The pipe SIGCHLD writes to, and its registration: as PID 1 we reap
/// every orphan of the sandbox, and SIGCHLD wakes the loop.
fn sigchld_pipe() -> Option<(OwnedFd, signal_hook::SigId)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK)
        .ok()
        .and_then(|(r, w)| {
            signal_hook::low_level::pipe::register(signal_hook::consts::SIGCHLD, File::from(w))
                .ok()
                .map(|id| (r, id))
        })
}

/// Rescues what serves an exec past its time limit and more (see
/// [`Pool::overdue`]), whatever else keeps init busy.
fn rescue_overdue(workers: &mut Pool, oneoff: &mut [(Pid, Instant)]) {
    let now = Instant::now();
    let mut overdue = workers.overdue(now);
    for (p, d) in oneoff {
        if *d <= now {
            *d = now + pool::RESCUE_AFTER;
            overdue.push(*p);
        }
    }
    for pid in overdue {
        rescue(pid);
    }
}

/// Waits for a connection, a worker's end or SIGCHLD, and trims when
/// idle long enough; None when woken for nothing to serve (a trim, a
/// rescue, a signal). Returns whether the listener is ready and the
/// workers that finished a job.
fn wait_for_work(
    listener: &UnixListener,
    sigchld: Option<&OwnedFd>,
    workers: &Pool,
    oneoff: &[(Pid, Instant)],
    busy_since_trim: &mut bool,
    idle_after: &mut Duration,
) -> Option<(bool, Vec<usize>)> {
    use rustix::event::{poll, PollFd, PollFlags};
    let timespec = |d: Duration| rustix::event::Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    };
    let mut fds = vec![PollFd::new(listener, PollFlags::IN)];
    if let Some(r) = sigchld {
        fds.push(PollFd::new(r, PollFlags::IN));
    }
    fds.extend(workers.channels().map(|c| PollFd::new(c, PollFlags::IN)));
    // Woken for the next rescue too, when nothing else happens.
    let rescue_in = workers
        .next_deadline()
        .into_iter()
        .chain(oneoff.iter().map(|(_, d)| *d))
        .min()
        .map(|d| d.saturating_duration_since(Instant::now()));
    let trim_in = busy_since_trim.then_some(*idle_after);
    let rescue_first = rescue_in.is_some_and(|r| trim_in.is_none_or(|t| r < t));
    let wait = if rescue_first { rescue_in } else { trim_in };
    match poll(&mut fds, wait.map(timespec).as_ref()) {
        Ok(0) => {
            drop(fds);
            if !rescue_first {
                trim();
                *busy_since_trim = false;
                *idle_after = IDLE_TRIM;
            }
            return None;
        }
        Ok(_) => *busy_since_trim = true,
        Err(rustix::io::Errno::INTR) => return None,
        Err(_) => exit_now(125),
    }
    let base = 1 + usize::from(sigchld.is_some());
    let finished: Vec<usize> = (0..workers.len())
        .filter(|&i| !fds[base + i].revents().is_empty())
        .collect();
    Some((!fds[0].revents().is_empty(), finished))
}

/// `Stop`: every process of the sandbox ended, the reply sent, init's
/// exit.
fn stop_and_exit(conn: &UnixStream, grace_ms: u64) -> ! {
    stop_all(Duration::from_millis(grace_ms));
    // The reply says no process of the sandbox is left but
    // init, which only exits after it: the client may take the
    // sandbox's outputs as final while the kernel unmounts.
    kill_and_reap_all(Duration::from_secs(10));
    let reply = Event::Ok {
        time_ns: worker::now_ns(),
        denied: crate::denials::sandbox_totals(),
    };
    let _ = protocol::send(conn, &reply, &[]);
    exit_now(0);
}

/// `StopKeepingLayer`: as [`stop_and_exit`], with the writable layer copied out
/// once nothing runs.
fn stop_keeping_layer_and_exit(conn: &UnixStream, grace_ms: u64, keep: Option<KeptLayer>) -> ! {
    stop_all(Duration::from_millis(grace_ms));
    kill_and_reap_all(Duration::from_secs(10));
    let copied = copy_layer_out(keep);
    let reply = match copied {
        Ok(()) => Event::Ok {
            time_ns: worker::now_ns(),
            denied: Vec::new(),
        },
        Err(message) => Event::Error { code: 125, message },
    };
    let _ = protocol::send(conn, &reply, &[]);
    exit_now(0);
}

/// `StopKeepingLayer`'s copy of the writable layer out.
fn copy_layer_out(keep: Option<KeptLayer>) -> std::result::Result<(), String> {
    match keep {
        Some(k) => rustix::fs::openat(
            &k.upper,
            ".",
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(std::io::Error::from)
        .and_then(|upper| crate::layer_copy::copy_tree(upper, k.dst))
        .map_err(|e| format!("copying the writable layer out: {e}")),
        None => Err("this sandbox keeps no layer (no keep_layer)".to_string()),
    }
}

/// The reply to a `Signal` for an exec that is not running.
fn no_such_exec(exec_id: &str) -> Event {
    Event::Error {
        code: 125,
        message: format!("no running exec {exec_id:?} in this sandbox"),
    }
}

/// The request unwrapped in the guarded mount namespace (see
/// [`enter_guarded`]); where that is refused, the client is told and the
/// process exits.
fn guarded_or_exit(req: Request, guarded: Option<&OwnedFd>, conn: &UnixStream) -> Request {
    match enter_guarded(&Kernel, req, guarded) {
        Ok(r) => r,
        Err(message) => {
            let _ = protocol::send(conn, &Event::Error { code: 125, message }, &[]);
            exit_now(125)
        }
    }
}

/// After a pooled request was handed to a worker: a detached exec is
/// noted by id; a failure is the client's reply.
fn note_dispatched(
    outcome: std::result::Result<Pid, pool::PoolError>,
    req: Request,
    conn: &UnixStream,
    detached: &mut HashMap<String, Pid>,
) {
    match outcome {
        Ok(pid) => {
            if let Request::Exec(ExecRequest {
                detach_id: Some(id),
                ..
            }) = req
            {
                detached.insert(id, pid);
            }
        }
        Err(e) => {
            let message = e.to_string();
            let _ = protocol::send(conn, &Event::Error { code: 125, message }, &[]);
        }
    }
}

/// An exec or a transfer, served in a worker or a process of its own.
fn serve_in_child(
    conn: &UnixStream,
    req: Request,
    mut fds: Vec<OwnedFd>,
    confinement: Confinement,
) -> i32 {
    let reply = |r: std::io::Result<()>| {
        let ev = match r {
            Ok(()) => Event::Ok {
                time_ns: worker::now_ns(),
                denied: Vec::new(),
            },
            Err(e) => Event::Error {
                code: 125,
                message: e.to_string(),
            },
        };
        let _ = protocol::send(conn, &ev, &[]);
    };
    // The reply to a request on `at`, whose error names it; the status.
    let reply_at = |at: &str, r: std::io::Result<()>| {
        let failed = r.is_err();
        reply(r.map_err(|e| std::io::Error::new(e.kind(), format!("{at}: {e}"))));
        i32::from(failed)
    };
    // The ids of the image's user `owner`; `None`, replied, when unknown.
    let owner_ids =
        |owner: Option<String>| match owner.as_deref().map(worker::lookup_user).transpose() {
            Ok(o) => Some(o.map(|u| (u.uid, u.gid))),
            Err(e) => {
                reply(Err(std::io::Error::other(e)));
                None
            }
        };
    match req {
        Request::Exec(exec) => worker::run(&Kernel, conn, exec, fds, confinement),
        Request::Download { path, follow } => {
            let Some(fd) = fds.pop() else { return 125 };
            let name = Path::new(&path)
                .file_name()
                .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned());
            let r = if follow {
                transfer::write_tar_following(Path::new(&path), &name, File::from(fd))
            } else {
                transfer::write_tar(Path::new(&path), &name, File::from(fd))
            };
            reply_at(&path, r)
        }
        Request::Upload { dst, name, owner } => {
            let Some(fd) = fds.pop() else { return 125 };
            let Some(owner) = owner_ids(owner) else {
                return 125;
            };
            let r = transfer::unpack_tar(File::from(fd), Path::new(&dst), &name, owner);
            reply_at(&dst, r)
        }
        Request::UploadTar { dst, owner } => {
            let Some(fd) = fds.pop() else { return 125 };
            let Some(owner) = owner_ids(owner) else {
                return 125;
            };
            let r = transfer::extract_into(File::from(fd), Path::new(&dst), owner);
            reply_at(&dst, r)
        }
        Request::Extract { dst, owner } => {
            let Some(fd) = fds.pop() else { return 125 };
            let r = transfer::extract_tar(File::from(fd), Path::new(&dst), owner);
            reply_at(&dst, r)
        }
        Request::Remove { path } => {
            let r = match std::fs::remove_dir_all(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                r => r,
            };
            reply_at(&path, r)
        }
        Request::GiveBack { path } => {
            let r = transfer::give_back(Path::new(&path));
            reply_at(&path, r)
        }
        Request::Chown { path, user } => {
            let r = chown_nofollow(&path, &user);
            reply_at(&path, r)
        }
        Request::MirrorOwners { dst } => {
            let r = transfer::mirror_owners(Path::new(&dst));
            reply_at(&dst, r)
        }
        Request::Snapshot => {
            let Some(fd) = fds.pop() else { return 125 };
            let r = transfer::write_root_tar(File::from(fd));
            let failed = r.is_err();
            reply(r);
            i32::from(failed)
        }
        _ => 125,
    }
}

/// `lchown(path)` to `user` of the image: the last component is not
/// followed, so a symlink planted there is chowned itself, and the lookup
/// happens inside the sandbox, where it reaches nothing of the host.
fn chown_nofollow(path: &str, user: &str) -> std::io::Result<()> {
    let u = worker::lookup_user(user).map_err(std::io::Error::other)?;
    rustix::fs::chownat(
        rustix::fs::CWD,
        path,
        Some(rustix::fs::Uid::from_raw(u.uid)),
        Some(rustix::fs::Gid::from_raw(u.gid)),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(std::io::Error::from)
}

/// A worker stopped (SIGSTOP from a process of the sandbox: it is no PID
/// 1, so nothing shields it) cannot end its command at the time limit, nor
/// report anything: its client would wait for ever, and an eval's agent
/// would run on unbounded. init, which no signal from inside reaches,
/// kills what runs below the worker and lets the worker go on; the worker
/// sees its deadline passed and reports the timeout.
fn rescue(worker: Pid) {
    for p in worker::descendants(worker) {
        let _ = rustix::process::kill_process(p, Signal::KILL);
    }
    let _ = rustix::process::kill_process(worker, Signal::CONT);
}

/// Signals a detached exec (whose subreaper is `anchor`): SIGKILL reaches
/// every process below it; other signals go to the command's process group.
fn signal_exec(anchor: Pid, signal: i32) {
    let Some(sig) = Signal::from_named_raw(signal) else {
        return;
    };
    if sig == Signal::KILL {
        for p in worker::descendants(anchor) {
            let _ = rustix::process::kill_process(p, sig);
        }
        return;
    }
    // `exec -d` answers before its command has forked and made its own
    // group: a signal sent in that window (a busy host) would find no group
    // and be lost, so it waits for one, briefly, while the anchor lives.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let mut sent = false;
        for p in worker::descendants(anchor) {
            // The command leads its own process group (or session).
            if rustix::process::getpgid(Some(p)).ok() == Some(p) {
                let _ = rustix::process::kill_process_group(p, sig);
                sent = true;
            }
        }
        if sent || !running(anchor) || std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// [`Request::EndProcesses`]: SIGKILL to every process of the sandbox but
/// init, its workers and its one-off serving processes (each waits for
/// what it served to end, and reports), and the trees of detached execs
/// (a compose service's command); again, until a round finds none left
/// (what was forked meanwhile is not missed) or a second passed. Returns
/// how many were ended.
fn end_processes(
    workers: &Pool,
    detached: &HashMap<String, Pid>,
    oneoff: &[(Pid, Instant)],
) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut ended = std::collections::HashSet::new();
    loop {
        let mut kept: std::collections::HashSet<i32> = std::collections::HashSet::new();
        kept.insert(1);
        kept.extend(workers.pids().map(|p| p.as_raw_nonzero().get()));
        kept.extend(oneoff.iter().map(|(p, _)| p.as_raw_nonzero().get()));
        for anchor in detached.values() {
            kept.insert(anchor.as_raw_nonzero().get());
            kept.extend(
                worker::descendants(*anchor)
                    .iter()
                    .map(|p| p.as_raw_nonzero().get()),
            );
        }
        let mut found = false;
        if let Ok(rd) = std::fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                    continue;
                };
                if kept.contains(&pid) {
                    continue;
                }
                // A zombie waits for its parent to reap it: nothing to end.
                let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        s.rfind(')')
                            .map(|i| s[i + 1..].trim_start().starts_with('Z'))
                    })
                    .unwrap_or(true);
                if zombie {
                    continue;
                }
                if let Some(p) = Pid::from_raw(pid) {
                    if rustix::process::kill_process(p, Signal::KILL).is_ok() {
                        found = true;
                        ended.insert(pid);
                    }
                }
            }
        }
        reap_finished();
        if !found || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // Gone, not only killed: their parents (workers, init) reap them at
    // once; what the verifier then lists is what is left.
    while Instant::now() < deadline
        && ended
            .iter()
            .any(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        reap_finished();
        std::thread::sleep(Duration::from_millis(1));
    }
    u32::try_from(ended.len()).unwrap_or(u32::MAX)
}

/// Whether `pid` exists and has not exited (a zombie has).
fn running(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero()))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Reaps every child that has exited; returns their pids.
fn reap_finished() -> Vec<Pid> {
    let mut out = Vec::new();
    while let Ok(Some((pid, _))) = rustix::process::wait(WaitOptions::NOHANG) {
        out.push(pid);
    }
    out
}

/// SIGTERM to every process of the sandbox, then up to `grace` for them to
/// end. Only init calls this, and kills what is left right after
/// ([`kill_and_reap_all`]).
fn stop_all(grace: Duration) {
    if grace.is_zero() {
        return;
    }
    let _ = sifbox_sys::kill_all(Signal::TERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && others_alive() {
        reap_finished();
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL to every process of the sandbox but init, then reaps them
/// until init has no child left (every process of the pid namespace
/// descends from init, and the orphans of the dying are handed to it), or
/// `limit` passed (a process stuck in the kernel: the kernel ends it when
/// init exits).
fn kill_and_reap_all(limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        // Again each round: nothing forked meanwhile is missed.
        let _ = sifbox_sys::kill_all(Signal::KILL);
        loop {
            match rustix::process::wait(WaitOptions::NOHANG) {
                Ok(Some(_)) => {}
                Err(rustix::io::Errno::CHILD) => return,
                Ok(None) | Err(_) => break,
            }
        }
        if Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Whether any process besides init (and the caller) remains.
fn others_alive() -> bool {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc").is_ok_and(|rd| {
        rd.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.bytes().all(|b| b.is_ascii_digit()) && n != "1" && n != me.as_str()
        })
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use rustix::io::Errno;
    use rustix::thread::LinkNameSpaceType;
    use sifbox_sys::syscall::fake::{Call, Obj, Recorder};

    use super::enter_guarded;
    use crate::protocol::Request;

    fn guarded_remove() -> Request {
        Request::Guarded {
            request: Box::new(Request::Remove { path: "/x".into() }),
        }
    }

    /// An fd standing for the guarded mount namespace.
    fn ns(dir: &std::path::Path) -> OwnedFd {
        OwnedFd::from(std::fs::File::open(dir).expect("open"))
    }

    #[test]
    fn a_guarded_file_request_enters_the_mount_namespace_through_the_seam() {
        let t = tempfile::tempdir().expect("tempdir");
        let sys = Recorder::new();
        let req = enter_guarded(&sys, guarded_remove(), Some(&ns(t.path()))).expect("entered");
        assert_eq!(req, Request::Remove { path: "/x".into() });
        let calls: Vec<Call> = sys.calls().into_iter().map(|e| e.call).collect();
        assert_eq!(
            calls,
            [Call::Setns {
                ns: Obj::Host(t.path().to_path_buf()),
                kind: Some(LinkNameSpaceType::Mount),
            }]
        );
    }

    #[test]
    fn a_refused_setns_names_the_step_and_errno_and_other_requests_enter_nothing() {
        let t = tempfile::tempdir().expect("tempdir");
        let sys = Recorder::new();
        sys.fail("setns", 1, Errno::PERM);
        let err = enter_guarded(&sys, guarded_remove(), Some(&ns(t.path()))).expect_err("refused");
        assert!(
            err.contains("entering the guarded mount namespace")
                && err.contains("Operation not permitted"),
            "{err}"
        );
        let sys = Recorder::new();
        let ping = Request::Guarded {
            request: Box::new(Request::Ping),
        };
        assert!(enter_guarded(&sys, ping, Some(&ns(t.path()))).is_err());
        assert!(enter_guarded(&sys, guarded_remove(), None).is_err());
        assert!(sys.calls().is_empty(), "no setns for a refused request");
    }
}
