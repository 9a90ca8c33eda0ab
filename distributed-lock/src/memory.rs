//! `memory://[instance]`: in-process stores by name, so that two clients connected to the
//! same URL in one process share one store (as two clients of one server do).

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock, PoisonError},
};

use lock_core::MemoryBackend;

static INSTANCES: OnceLock<Mutex<HashMap<String, MemoryBackend>>> = OnceLock::new();

/// The in-process store named `instance` (created on first use; `""` is the default one).
pub(crate) fn instance(instance: &str) -> MemoryBackend {
    INSTANCES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(instance.to_owned())
        .or_default()
        .clone()
}
