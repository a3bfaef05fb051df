//! The default seccomp policy's denials, heard and counted, so that `run`
//! and `exec` can say which calls were denied (Docker's denials are
//! silent: a program fails with EPERM and nobody knows why).
//!
//! The exec worker installs the policy with a listener
//! ([`crate::seccomp::install_reporting`]): every call the policy denies
//! waits for the listener, which [`serve`] answers EPERM after counting it
//! by system call number. Allowed calls never reach it. Two sets of
//! counters:
//! - per process, for the current exec: [`take_exec`] reads and clears
//!   them when the exec ends (its `Exit` event carries them);
//! - per sandbox, in a shared mapping that init makes ([`share`]) before
//!   it forks its workers, so that every worker counts into what init
//!   reads when the sandbox stops ([`sandbox_totals`]).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// One system call the policy denied, and how often.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denied {
    /// The call's name (`syscall N` where the policy does not name it).
    pub syscall: String,
    pub count: u64,
}

/// Counter slots: one per system call number below `SLOTS - 1` (every
/// number the policy answers EPERM is below 470 on x86_64 and aarch64);
/// the last counts any other number (x32 calls on x86_64).
const SLOTS: usize = 512;

/// This process's counters, for the current exec.
static EXEC: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// The sandbox's counters, shared by init and every worker it forks.
static SHARED: OnceLock<&'static [AtomicU64]> = OnceLock::new();

/// Whether this process serves a listener (else there is nothing to read).
static SERVING: AtomicBool = AtomicBool::new(false);

/// The stack of the listener thread: it only receives, counts and answers.
const STACK: usize = 64 * 1024;

/// Makes the sandbox-wide counters; called once, by init, before it forks
/// workers. A failure leaves them out: denials are then reported per exec
/// only.
pub fn share() {
    if SHARED.get().is_none() {
        if let Ok(counters) = sifbox_sys::seccomp_notify::shared_counters(SLOTS) {
            let _ = SHARED.set(counters);
        }
    }
}

/// The slot of system call `nr`.
fn slot(nr: i32) -> usize {
    usize::try_from(nr)
        .ok()
        .filter(|n| *n < SLOTS - 1)
        .unwrap_or(SLOTS - 1)
}

/// Counts one denial of `nr`.
fn count(nr: i32) {
    let i = slot(nr);
    EXEC[i].fetch_add(1, Ordering::Relaxed);
    if let Some(shared) = SHARED.get() {
        shared[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// The name of slot `i`.
fn name(i: usize) -> String {
    if i == SLOTS - 1 {
        return "a call numbered above 510".to_string();
    }
    let nr = i64::try_from(i).unwrap_or_default();
    crate::seccomp::syscall_name(nr).map_or_else(|| format!("syscall {nr}"), str::to_string)
}

/// The non-zero counters, in number order; with `clear`, reset to zero.
fn read(counters: &[AtomicU64], clear: bool) -> Vec<Denied> {
    let mut out = Vec::new();
    for (i, c) in counters.iter().enumerate() {
        let n = if clear {
            c.swap(0, Ordering::Relaxed)
        } else {
            c.load(Ordering::Relaxed)
        };
        if n > 0 {
            out.push(Denied {
                syscall: name(i),
                count: n,
            });
        }
    }
    out
}

/// The denials this process heard since the last call (the current exec's,
/// called when it ends; called when it starts, to drop what processes of
/// an earlier exec were denied after it ended).
pub fn take_exec() -> Vec<Denied> {
    if !SERVING.load(Ordering::Relaxed) {
        return Vec::new();
    }
    read(&EXEC, true)
}

/// Every denial in the sandbox so far (init, at stop).
pub fn sandbox_totals() -> Vec<Denied> {
    SHARED.get().map(|c| read(c, false)).unwrap_or_default()
}

/// Answers every call the policy denies EPERM, counting it, in a thread of
/// its own, for as long as this process lives. EINTR and ENOENT (the
/// caller died, or a signal took it out of the call) are retried; any other
/// failure of the listener ends the thread, and the kernel then answers
/// ENOSYS to what would have been heard.
pub fn serve(listener: OwnedFd) -> std::io::Result<()> {
    let mut notifier = sifbox_sys::seccomp_notify::Notifier::new(listener)?;
    std::thread::Builder::new()
        .stack_size(STACK)
        .spawn(move || {
            // Signals to the process stay the main thread's business.
            let _ = sifbox_sys::seccomp_notify::block_signals_in_this_thread();
            loop {
                match notifier.receive() {
                    Ok(n) => {
                        count(n.nr);
                        // ENOENT: the caller is gone; nothing to answer.
                        let _ = notifier.deny(n.id, libc::EPERM);
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::ENOENT)) => {}
                    Err(_) => return,
                }
            }
        })?;
    SERVING.store(true, Ordering::Relaxed);
    Ok(())
}

/// Adds `more` to `into`, by name.
pub fn merge(into: &mut Vec<Denied>, more: &[Denied]) {
    for d in more {
        match into.iter_mut().find(|e| e.syscall == d.syscall) {
            Some(e) => e.count = e.count.saturating_add(d.count),
            None => into.push(d.clone()),
        }
    }
}

/// One stderr line per denied call, saying where the policy is explained
/// and how to lift it.
pub fn lines(denied: &[Denied]) -> Vec<String> {
    denied
        .iter()
        .map(|d| {
            let times = if d.count == 1 { "time" } else { "times" };
            format!(
                "sifbox: the sandbox's seccomp policy denied {} {} {times} (EPERM; why: SECURITY.md, \"The default seccomp policy\"; --seccomp unconfined lifts it)",
                d.syscall, d.count
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(syscall: &str, count: u64) -> Denied {
        Denied {
            syscall: syscall.into(),
            count,
        }
    }

    #[test]
    fn slots_and_names() {
        assert_eq!(slot(0), 0);
        assert_eq!(slot(510), 510);
        assert_eq!(slot(511), SLOTS - 1);
        assert_eq!(slot(-1), SLOTS - 1);
        assert_eq!(slot(0x4000_0000), SLOTS - 1);
        let keyctl = usize::try_from(libc::SYS_keyctl).expect("small");
        assert_eq!(name(keyctl), "keyctl");
        assert_eq!(name(SLOTS - 1), "a call numbered above 510");
    }

    #[test]
    fn counters_read_and_clear() {
        let counters: Vec<AtomicU64> = (0..SLOTS).map(|_| AtomicU64::new(0)).collect();
        let keyctl = usize::try_from(libc::SYS_keyctl).expect("small");
        counters[keyctl].fetch_add(3, Ordering::Relaxed);
        counters[SLOTS - 1].fetch_add(1, Ordering::Relaxed);
        let want = vec![d("keyctl", 3), d("a call numbered above 510", 1)];
        assert_eq!(read(&counters, false), want);
        assert_eq!(read(&counters, true), want);
        assert!(read(&counters, false).is_empty());
    }

    #[test]
    fn merge_adds_by_name() {
        let mut all = vec![d("keyctl", 1)];
        merge(&mut all, &[d("bpf", 2), d("keyctl", 4)]);
        assert_eq!(all, vec![d("keyctl", 5), d("bpf", 2)]);
    }

    #[test]
    fn one_line_per_call_with_the_count_and_the_reason() {
        let l = lines(&[d("keyctl", 3), d("bpf", 1)]);
        assert_eq!(l.len(), 2);
        assert_eq!(
            l[0],
            "sifbox: the sandbox's seccomp policy denied keyctl 3 times (EPERM; why: SECURITY.md, \"The default seccomp policy\"; --seccomp unconfined lifts it)"
        );
        assert!(l[1].contains("denied bpf 1 time (EPERM"));
        assert!(lines(&[]).is_empty());
    }

    #[test]
    fn nothing_to_take_without_a_listener() {
        assert!(take_exec().is_empty());
        assert!(sandbox_totals().is_empty());
    }

    #[test]
    fn denied_round_trips_through_json() {
        let v = vec![d("keyctl", 2)];
        let s = serde_json::to_string(&v).expect("json");
        assert_eq!(s, r#"[{"syscall":"keyctl","count":2}]"#);
        let back: Vec<Denied> = serde_json::from_str(&s).expect("parse");
        assert_eq!(back, v);
    }
}
