//! How a pull shows its progress on stderr: a bar per blob with bytes and
//! rate on a terminal, one line per blob otherwise, nothing when quiet.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sifbox_image::layer::BlobDescriptor;
use sifbox_registry::{BlobOutcome, Progress, Silent};

/// The progress display for this process's stderr.
pub fn for_stderr(quiet: bool) -> Arc<dyn Progress> {
    if quiet {
        Arc::new(Silent)
    } else if std::io::stderr().is_terminal() {
        Arc::new(Bars::new())
    } else {
        Arc::new(Lines::default())
    }
}

fn short(b: &BlobDescriptor) -> String {
    let d = b.digest.to_string();
    d.chars().take("sha256:".len() + 12).collect()
}

pub fn mib(bytes: u64) -> f64 {
    // Display only: the precision lost above 2^53 bytes does not matter.
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    b / (1024.0 * 1024.0)
}

/// One line per blob when it is done (or starts over), and per step.
#[derive(Debug, Default)]
struct Lines {
    started: Mutex<Option<Instant>>,
}

impl Lines {
    fn say(&self, line: &str) {
        let mut e = std::io::stderr().lock();
        let _ = writeln!(e, "{line}");
    }
}

impl Progress for Lines {
    fn resolved(&self, manifest: &str, blobs: &[BlobDescriptor]) {
        if let Ok(mut s) = self.started.lock() {
            *s = Some(Instant::now());
        }
        let total: u64 = blobs.iter().map(|b| b.size).sum();
        self.say(&format!(
            "manifest {manifest}: {} blobs, {:.1} MiB",
            blobs.len(),
            mib(total)
        ));
    }

    fn blob_started(&self, blob: &BlobDescriptor, resumed_from: u64) {
        if resumed_from > 0 {
            self.say(&format!(
                "{}: resuming at byte {resumed_from} of {}",
                short(blob),
                blob.size
            ));
        }
    }

    fn blob_restarted(&self, blob: &BlobDescriptor) {
        self.say(&format!(
            "{}: the registry ignored the range: downloading it whole",
            short(blob)
        ));
    }

    fn blob_finished(&self, blob: &BlobDescriptor, outcome: &BlobOutcome) {
        let line = match outcome {
            BlobOutcome::Cached => format!("{}: cached", short(blob)),
            BlobOutcome::Downloaded {
                bytes,
                resumed_from,
                seconds,
            } => {
                let rate = mib(*bytes) / seconds.max(1e-3);
                let resumed = if *resumed_from > 0 {
                    format!(" (resumed at byte {resumed_from})")
                } else {
                    String::new()
                };
                format!(
                    "{}: downloaded {:.1} MiB in {seconds:.2}s ({rate:.1} MiB/s){resumed}",
                    short(blob),
                    mib(*bytes)
                )
            }
        };
        self.say(&line);
    }

    fn step(&self, message: &str) {
        self.say(message);
    }
}

/// A bar per blob.
#[derive(Debug)]
struct Bars {
    multi: MultiProgress,
    bars: Mutex<Vec<(String, ProgressBar)>>,
}

impl Bars {
    fn new() -> Bars {
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: Mutex::new(Vec::new()),
        }
    }

    fn bar(&self, blob: &BlobDescriptor) -> Option<ProgressBar> {
        let key = blob.digest.to_string();
        let bars = self.bars.lock().ok()?;
        bars.iter().find(|(k, _)| *k == key).map(|(_, b)| b.clone())
    }
}

impl Progress for Bars {
    fn resolved(&self, _manifest: &str, blobs: &[BlobDescriptor]) {
        let style = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        let Ok(mut bars) = self.bars.lock() else {
            return;
        };
        for b in blobs {
            let key = b.digest.to_string();
            if bars.iter().any(|(k, _)| *k == key) {
                continue;
            }
            let bar = self.multi.add(ProgressBar::new(b.size));
            bar.set_style(style.clone());
            bar.set_prefix(short(b));
            bars.push((key, bar));
        }
    }

    fn blob_started(&self, blob: &BlobDescriptor, resumed_from: u64) {
        if let Some(bar) = self.bar(blob) {
            bar.set_position(resumed_from);
            bar.reset_eta();
            if resumed_from > 0 {
                bar.set_message("resumed");
            }
        }
    }

    fn blob_bytes(&self, blob: &BlobDescriptor, bytes: u64) {
        if let Some(bar) = self.bar(blob) {
            bar.inc(bytes);
        }
    }

    fn blob_restarted(&self, blob: &BlobDescriptor) {
        if let Some(bar) = self.bar(blob) {
            bar.set_position(0);
        }
    }

    fn blob_finished(&self, blob: &BlobDescriptor, outcome: &BlobOutcome) {
        if let Some(bar) = self.bar(blob) {
            bar.set_position(blob.size);
            match outcome {
                BlobOutcome::Cached => bar.finish_with_message("cached"),
                BlobOutcome::Downloaded { .. } => bar.finish_with_message("done"),
            }
        }
    }

    fn step(&self, message: &str) {
        let _ = self.multi.println(message);
    }
}
