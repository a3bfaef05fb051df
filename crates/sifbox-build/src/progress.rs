//! Build output in the style of BuildKit's plain progress:
//!
//! ```text
//! #3 [app 2/5] RUN make
//! #3 0.412 cc -o app app.c
//! #3 DONE 1.3s
//! #4 [app 3/5] COPY . /src
//! #4 CACHED
//! ```
//!
//! `plain` prints every line of RUN output; `auto` does the same when
//! stderr is not a terminal and, on a terminal, keeps each running step on
//! one line that shows its latest output (condensed); `quiet` prints
//! nothing but errors.

use std::io::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How much to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    #[default]
    Auto,
    Plain,
    Quiet,
}

impl Mode {
    /// Parses `auto`, `plain`, `tty` (as auto) or `quiet`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "auto" | "tty" => Some(Mode::Auto),
            "plain" => Some(Mode::Plain),
            "quiet" => Some(Mode::Quiet),
            _ => None,
        }
    }
}

/// The one live status line of sifbox's displays on a terminal's stderr (a
/// build's condensed steps, eval's job status): redrawn in place, cut to
/// the terminal's width, with whole lines printed above it.
#[derive(Debug, Default)]
pub struct StatusLine {
    shown: bool,
}

impl StatusLine {
    /// Shows `text` as the status line (in place of what it showed).
    pub fn show(&mut self, text: &str) {
        let cut: String = text
            .chars()
            .take(terminal_width().saturating_sub(1))
            .collect();
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K{cut}");
        let _ = e.flush();
        self.shown = true;
    }

    /// Prints `text` as a line of its own where the status line was (show
    /// the status again after).
    pub fn println(&mut self, text: &str) {
        self.clear();
        let _ = writeln!(std::io::stderr(), "{text}");
    }

    /// Keeps what the status line shows as a line of its own.
    pub fn commit(&mut self) {
        if self.shown {
            let _ = writeln!(std::io::stderr());
            self.shown = false;
        }
    }

    /// Removes the status line.
    pub fn clear(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}

#[derive(Debug)]
struct State {
    n: usize,
    header: String,
    started: Instant,
    last: String,
    line: StatusLine,
}

/// The build's progress display (shared with the threads that read step
/// output).
#[derive(Debug)]
pub struct Progress {
    mode: Mode,
    condensed: bool,
    state: Mutex<State>,
    /// Where lines go instead of stderr (see [`Progress::to_file`]).
    sink: Option<Mutex<std::fs::File>>,
}

impl Progress {
    /// A display writing to stderr.
    pub fn new(mode: Mode) -> Progress {
        let tty = rustix::termios::isatty(std::io::stderr());
        Progress {
            mode,
            condensed: mode == Mode::Auto && tty,
            state: Mutex::new(State {
                n: 0,
                header: String::new(),
                started: Instant::now(),
                last: String::new(),
                line: StatusLine::default(),
            }),
            sink: None,
        }
    }

    /// A display writing every line, as `plain` does, to `file` instead of
    /// stderr: the log of a build that runs among others (`sifbox eval`).
    pub fn to_file(file: std::fs::File) -> Progress {
        Progress {
            sink: Some(Mutex::new(file)),
            condensed: false,
            ..Progress::new(Mode::Plain)
        }
    }

    /// Writes a line to the sink; false when there is none.
    fn to_sink(&self, line: &str) -> bool {
        let Some(sink) = &self.sink else {
            return false;
        };
        let mut f = sink
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = writeln!(f, "{line}");
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn print(&self, line: &str) {
        if self.to_sink(line) {
            return;
        }
        if self.condensed {
            self.lock().line.show(line);
        } else {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    }

    /// A step starts: `[label i/total] text`.
    pub fn step(&self, label: &str, i: usize, total: usize, text: &str) {
        if self.mode == Mode::Quiet {
            return;
        }
        let mut s = self.lock();
        s.n += 1;
        s.header = format!("#{} [{label} {i}/{total}] {}", s.n, one_line(text));
        s.started = Instant::now();
        s.last.clear();
        let h = s.header.clone();
        drop(s);
        self.print(&h);
    }

    /// A line the step's command printed.
    pub fn output(&self, line: &str) {
        if self.mode == Mode::Quiet {
            return;
        }
        let mut s = self.lock();
        let t = s.started.elapsed().as_secs_f64();
        if self.condensed {
            s.last = line.to_string();
            let shown = format!("{} | {}", s.header, one_line(line));
            drop(s);
            self.print(&shown);
        } else {
            let n = s.n;
            drop(s);
            self.print(&format!("#{n} {t:.3} {line}"));
        }
    }

    /// The step ended (from the cache or after running for `took`).
    pub fn done(&self, cached: bool, took: Duration) {
        if self.mode == Mode::Quiet {
            return;
        }
        let s = self.lock();
        let end = if cached {
            "CACHED".to_string()
        } else {
            format!("DONE {:.1}s", took.as_secs_f64())
        };
        let line = if self.condensed {
            format!("{} {end}", s.header)
        } else {
            format!("#{} {end}", s.n)
        };
        drop(s);
        self.print(&line);
        if self.condensed {
            self.lock().line.commit();
        }
    }

    /// A step of the build's own (exporting the image).
    pub fn note(&self, what: &str) {
        if self.mode == Mode::Quiet {
            return;
        }
        let mut s = self.lock();
        s.n += 1;
        s.header = format!("#{} {what}", s.n);
        s.started = Instant::now();
        let h = s.header.clone();
        drop(s);
        self.print(&h);
    }

    /// A warning (always printed, also in quiet mode).
    pub fn warn(&self, msg: &str) {
        if self.to_sink(msg) {
            return;
        }
        if self.condensed {
            self.lock().line.println(msg);
        } else {
            let _ = writeln!(std::io::stderr(), "{msg}");
        }
    }
}

fn one_line(s: &str) -> String {
    let first = s.lines().next().unwrap_or_default();
    if s.lines().nth(1).is_some() {
        format!("{first} ...")
    } else {
        first.to_string()
    }
}

/// The width of the terminal on stderr (100 when it says none).
pub fn terminal_width() -> usize {
    rustix::termios::tcgetwinsize(std::io::stderr())
        .map(|w| usize::from(w.ws_col))
        .ok()
        .filter(|w| *w > 10)
        .unwrap_or(100)
}
