//! SIGINT, SIGTERM and SIGHUP, for the commands that clean up on them
//! (`run`, `build`, `eval`): installed here, once. Each command says what
//! a signal does; the first one caught decides its exit status (128+N).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use sifbox_engine::Error;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// The signals being watched, until [`Interrupts::stop`].
#[derive(Debug)]
pub struct Interrupts {
    handle: signal_hook::iterator::Handle,
    first: Arc<AtomicI32>,
}

impl Interrupts {
    /// Watches SIGINT, SIGTERM and SIGHUP: `on_signal` runs on a thread of
    /// its own for each one caught. (Install it after forking a
    /// supervisor, which must inherit no handler.)
    pub fn watch(mut on_signal: impl FnMut(i32) + Send + 'static) -> crate::error::Result<Self> {
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
            .map_err(|e| Error::io("installing signal handlers", e))?;
        let handle = signals.handle();
        let first = Arc::new(AtomicI32::new(0));
        let caught = Arc::clone(&first);
        std::thread::spawn(move || {
            for sig in signals.forever() {
                let _ = caught.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
                on_signal(sig);
            }
        });
        Ok(Interrupts { handle, first })
    }

    /// Stops watching; the first signal caught, if one was.
    pub fn stop(&self) -> Option<i32> {
        self.handle.close();
        match self.first.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

/// How messages name a signal.
pub fn name(sig: i32) -> &'static str {
    match sig {
        SIGINT => "SIGINT (Ctrl-C)",
        SIGTERM => "SIGTERM",
        SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}
