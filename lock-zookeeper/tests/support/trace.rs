//! A minimal in-memory `tracing` subscriber: keeps the last events (this crate's and the
//! ZooKeeper client's) so a failing fault case can show what happened.

use std::{
    collections::VecDeque,
    fmt::Write as _,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use tracing::{
    Event, Level, Metadata, Subscriber,
    field::{Field, Visit},
    span::{Attributes, Id, Record},
};

const KEEP: usize = 4000;

pub(crate) struct Recorder {
    start: Instant,
    lines: Mutex<VecDeque<String>>,
    next_span: AtomicU64,
}

static RECORDER: std::sync::OnceLock<&'static Recorder> = std::sync::OnceLock::new();

/// Installs the recorder as the global subscriber (once).
pub(crate) fn install() {
    let recorder = *RECORDER.get_or_init(|| {
        Box::leak(Box::new(Recorder {
            start: Instant::now(),
            lines: Mutex::new(VecDeque::with_capacity(KEEP)),
            next_span: AtomicU64::new(1),
        }))
    });
    let _ = tracing::subscriber::set_global_default(Forward(recorder));
}

/// The last `n` events.
pub(crate) fn last(n: usize) -> Vec<String> {
    RECORDER.get().map_or_else(Vec::new, |r| {
        let lines = r.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines
            .iter()
            .skip(lines.len().saturating_sub(n))
            .cloned()
            .collect()
    })
}

struct Forward(&'static Recorder);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl Subscriber for Forward {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= &Level::DEBUG
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.0.next_span.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        // Every request's and ping's reply: too many to keep, too little to tell.
        if fields.0.contains("operation get reply") || fields.0.contains("got ping response") {
            return;
        }
        let line = format!(
            "{:>9.3}s {} {}{}",
            self.0.start.elapsed().as_secs_f64(),
            event.metadata().level(),
            event.metadata().target(),
            fields.0
        );
        let mut lines = self.0.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == KEEP {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
