//! The `Metrics` layer, read back through a real recorder (metrics-util's
//! `DebuggingRecorder`): acquisitions by outcome, contention, hold times, losses by reason,
//! renewals, and the held and waiting gauges back at zero; the `name` label only through the
//! mapper, and never the raw name.

use std::time::Duration;

use distributed_lock::{LockClient, LockName, LockOptions, LossReason, layer::Metrics};
use lock_core::{LockAdmin, MemoryBackend};
use metrics_util::{
    CompositeKey, MetricKind,
    debugging::{DebugValue, DebuggingRecorder},
};

/// The value of the metric `name` of `kind` whose labels include every one of `labels`,
/// summed over the series that match.
fn find<'a>(
    snapshot: &'a [(
        CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )],
    kind: MetricKind,
    name: &str,
    labels: &[(&str, &str)],
) -> Vec<&'a DebugValue> {
    snapshot
        .iter()
        .filter(|(key, ..)| key.kind() == kind && key.key().name() == name)
        .filter(|(key, ..)| {
            labels.iter().all(|(k, v)| {
                key.key()
                    .labels()
                    .any(|label| label.key() == *k && label.value() == *v)
            })
        })
        .map(|(.., value)| value)
        .collect()
}

fn counter(values: &[&DebugValue]) -> u64 {
    values
        .iter()
        .map(|v| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

fn samples(values: &[&DebugValue]) -> usize {
    values
        .iter()
        .map(|v| match v {
            DebugValue::Histogram(samples) => samples.len(),
            _ => 0,
        })
        .sum()
}

fn gauge(values: &[&DebugValue]) -> f64 {
    values
        .iter()
        .map(|v| match v {
            DebugValue::Gauge(g) => g.0,
            _ => 0.0,
        })
        .sum()
}

/// Waits until a waiter queues for `jobs/1` (the store's own count, through `LockAdmin`).
#[allow(clippy::unwrap_used, clippy::panic)] // test set-up: a failure is the test's
async fn until_queued(memory: &MemoryBackend) {
    for _ in 0..10_000 {
        let held = memory.list("jobs/").await.unwrap();
        if held.first().and_then(|h| h.waiters) == Some(1) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the waiter never queued");
}

/// The recorded values after one client's run: A takes `jobs/1` uncontended, B waits for it,
/// a one-try finds it held, A releases, B gets it and loses it to an operator.
#[allow(clippy::unwrap_used)] // test set-up: a failure is the test's
fn recorded() -> Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)> {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let memory = MemoryBackend::new();
            let backend = Metrics::new(memory.clone())
                .name_label(|name| name.as_str().split('/').next().map(str::to_owned));
            let client = LockClient::new(backend);
            let options = LockOptions::new()
                .ttl(Duration::from_millis(300))
                .wait(Duration::from_secs(5));

            // Uncontended, then contended: B waits while A holds.
            let a = client.lock_with("jobs/1", &options).await.unwrap();
            let waiter = {
                let (client, options) = (client.clone(), options.clone());
                tokio::spawn(async move { client.lock_with("jobs/1", &options).await })
            };
            until_queued(&memory).await;
            // A one-try on the held lock times out (and is contended too).
            let busy = client.try_lock("jobs/1").await.unwrap();
            assert!(busy.is_none());
            a.release().await.unwrap();
            let b = waiter.await.unwrap().unwrap();

            // A waiter that gives up (its future dropped) is no longer counted as waiting.
            let gave_up = {
                let (client, options) = (client.clone(), options.clone());
                tokio::spawn(async move { client.lock_with("jobs/1", &options).await })
            };
            until_queued(&memory).await;
            gave_up.abort();
            assert!(gave_up.await.unwrap_err().is_cancelled());

            // B's hold taken away: its next renewal says NotHeld.
            assert!(memory.evict(&LockName::new("jobs/1").unwrap()));
            assert_eq!(b.lost().await, LossReason::NotHeld);
            drop(b);
        });
    });
    snapshotter.snapshot().into_vec()
}

#[test]
fn the_layer_reports_through_a_real_recorder() {
    let snapshot = recorded();
    let jobs = [("store", "memory"), ("name", "jobs")];
    let acquired = find(
        &snapshot,
        MetricKind::Histogram,
        "lock_acquire_duration_seconds",
        &[
            ("store", "memory"),
            ("name", "jobs"),
            ("outcome", "acquired"),
        ],
    );
    assert_eq!(samples(&acquired), 2, "{snapshot:#?}");
    let timeouts = find(
        &snapshot,
        MetricKind::Histogram,
        "lock_acquire_duration_seconds",
        &[("outcome", "timeout")],
    );
    assert_eq!(samples(&timeouts), 1);
    assert_eq!(
        counter(&find(
            &snapshot,
            MetricKind::Counter,
            "lock_contended_total",
            &jobs
        )),
        3 // B, the one-try, the waiter that gave up
    );
    assert_eq!(
        samples(&find(
            &snapshot,
            MetricKind::Histogram,
            "lock_hold_duration_seconds",
            &jobs
        )),
        2
    );
    assert_eq!(
        counter(&find(
            &snapshot,
            MetricKind::Counter,
            "lock_lost_total",
            &[("store", "memory"), ("reason", "not_held")],
        )),
        1
    );
    assert!(
        samples(&find(
            &snapshot,
            MetricKind::Histogram,
            "lock_renew_duration_seconds",
            &jobs
        )) >= 1
    );
    assert!(
        counter(&find(
            &snapshot,
            MetricKind::Counter,
            "lock_renew_failures_total",
            &jobs
        )) >= 1
    );
    assert_eq!(
        gauge(&find(&snapshot, MetricKind::Gauge, "lock_held", &jobs)),
        0.0
    );
    assert_eq!(
        gauge(&find(&snapshot, MetricKind::Gauge, "lock_waiting", &jobs)),
        0.0
    );
    // The raw name is never a label value.
    for (key, ..) in &snapshot {
        assert!(
            key.key().labels().all(|label| label.value() != "jobs/1"),
            "{key:?}"
        );
    }
}
