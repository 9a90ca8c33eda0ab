//! What `lockctl` prints: a table for people, or JSON for scripts (`--json`).

use std::time::Duration;

use comfy_table::Table;
use distributed_lock::{
    Capabilities, Forced, HeldLock, LockGuard, LockName, LossReason, StoreConfig,
};
use serde_json::{Value, json};

use crate::bench::Phase;

/// How the output is written.
pub(crate) struct Output {
    json: bool,
}

fn millis(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| {
        json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

fn held_json(h: &HeldLock) -> Value {
    json!({
        "name": h.name.as_str(),
        "holder": h.holder,
        "fence": h.fence.get(),
        "expires_in_ms": millis(h.expires_in),
        "waiters": h.waiters,
    })
}

fn shown<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn duration(d: Option<Duration>) -> String {
    shown(d.map(|d| {
        humantime::format_duration(Duration::from_millis(
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        ))
    }))
}

impl Output {
    pub(crate) fn new(json: bool) -> Self {
        Self { json }
    }

    fn print(&self, value: &Value, table: impl FnOnce() -> String) {
        if self.json {
            println!("{value}");
        } else {
            println!("{}", table());
        }
    }

    pub(crate) fn held(&self, held: &[HeldLock]) {
        let value = Value::Array(held.iter().map(held_json).collect());
        self.print(&value, || {
            let mut table = Table::new();
            table.set_header(["name", "holder", "fence", "expires in", "waiters"]);
            for h in held {
                table.add_row([
                    h.name.to_string(),
                    h.holder.clone(),
                    h.fence.to_string(),
                    duration(h.expires_in),
                    shown(h.waiters),
                ]);
            }
            format!("{table}\n{} held", held.len())
        });
    }

    pub(crate) fn status(&self, name: &LockName, held: Option<&HeldLock>) {
        let value = match held {
            Some(h) => json!({ "name": name.as_str(), "held": true, "lock": held_json(h) }),
            None => json!({ "name": name.as_str(), "held": false }),
        };
        self.print(&value, || match held {
            Some(h) => format!(
                "`{name}` is held by {} with fence {} (expires in {}, waiters {})",
                h.holder,
                h.fence,
                duration(h.expires_in),
                shown(h.waiters)
            ),
            None => format!("`{name}` is free"),
        });
    }

    pub(crate) fn holding(&self, name: &LockName, guard: &LockGuard) {
        let value = json!({
            "event": "held",
            "name": name.as_str(),
            "fence": guard.fence().get(),
            "holder": guard.lease().token().fingerprint(),
            "ttl_ms": u64::try_from(guard.lease().ttl().as_millis()).unwrap_or(u64::MAX),
        });
        self.print(&value, || {
            format!(
                "holding `{name}` with fence {} (holder {}); Ctrl-C releases it",
                guard.fence(),
                guard.lease().token().fingerprint()
            )
        });
    }

    pub(crate) fn lost(&self, name: &LockName, reason: LossReason) {
        let value =
            json!({ "event": "lost", "name": name.as_str(), "reason": format!("{reason:?}") });
        self.print(&value, || format!("lost `{name}`: {reason}"));
    }

    pub(crate) fn released(&self, name: &LockName) {
        let value = json!({ "event": "released", "name": name.as_str() });
        self.print(&value, || format!("released `{name}`"));
    }

    pub(crate) fn forced(&self, name: &LockName, forced: Option<&Forced>) {
        let value = match forced {
            Some(f) => json!({
                "name": name.as_str(),
                "released": true,
                "evicted": held_json(&f.evicted),
                "fence_floor": f.fence_floor.get(),
            }),
            None => json!({ "name": name.as_str(), "released": false }),
        };
        self.print(&value, || match forced {
            Some(f) => format!(
                "took `{name}` from holder {} (fence {}); it learns at its next renewal. \
                 Resources that reject fences below {} reject its late writes.",
                f.evicted.holder, f.evicted.fence, f.fence_floor
            ),
            None => format!("`{name}` was not held"),
        });
    }

    pub(crate) fn capabilities(&self, config: &StoreConfig, caps: &Capabilities) {
        let value = json!({ "store": config.store.label(), "capabilities": caps });
        self.print(&value, || {
            let mut table = Table::new();
            table.set_header(["store", "property", "declared"]);
            if let Value::Object(fields) = json!(caps) {
                for (key, declared) in fields {
                    let declared = match declared {
                        Value::String(text) => text,
                        other => other.to_string(),
                    };
                    table.add_row([config.store.label(), key, declared]);
                }
            }
            table.to_string()
        });
    }

    pub(crate) fn migration(&self, step: &str, value: &Value) {
        self.print(value, || format!("migrate {step}: {value}"));
    }

    pub(crate) fn bench(&self, phases: &[Phase]) {
        let value = json!(phases);
        self.print(&value, || {
            let mut table = Table::new();
            table.set_header([
                "clients",
                "acquisitions/s",
                "cycle p50",
                "cycle p99",
                "per client min / max",
                "Jain",
            ]);
            for p in phases {
                table.add_row([
                    p.clients.to_string(),
                    format!("{:.0}", p.per_second),
                    format!("{} µs", p.p50_us),
                    format!("{} µs", p.p99_us),
                    format!("{} / {}", p.min, p.max),
                    format!("{:.2}", p.jain),
                ]);
            }
            table.to_string()
        });
    }
}
