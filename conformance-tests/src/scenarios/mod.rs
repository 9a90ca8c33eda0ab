//! Every scenario of the suite, registered with the contract item it covers and when it
//! applies.

mod cancellation;
mod dropping;
mod exclusion;
mod expiry;
mod fencing;
mod input;
mod leases;
mod leftovers;
mod loss;
mod outage;
mod ownership;
mod process;
mod reentrancy;
mod waiting;
mod watchdog;

use crate::scenario::{
    Scenario, always, cross_process, fifo, foreign, outages, portable, starvation_free, ttl_expiry,
};

macro_rules! scenario {
    ($name:literal, $covers:literal, $applies:expr, $run:path) => {
        Scenario {
            name: $name,
            covers: $covers,
            applies: $applies,
            run: |ctx| Box::pin($run(ctx)),
        }
    };
}

/// The whole suite, in run order.
pub fn all() -> Vec<Scenario> {
    vec![
        scenario!(
            "exclusion/try_acquire_excludes",
            "1 mutual exclusion",
            always,
            exclusion::try_acquire_excludes
        ),
        scenario!(
            "exclusion/holders_in_one_process_exclude",
            "1, 6 holders",
            always,
            exclusion::holders_in_one_process_exclude
        ),
        scenario!(
            "exclusion/contention_loses_no_update",
            "1 mutual exclusion",
            always,
            exclusion::contention_loses_no_update
        ),
        scenario!(
            "ownership/forged_release_changes_nothing",
            "2 owner-only",
            always,
            ownership::forged_release_changes_nothing
        ),
        scenario!(
            "ownership/forged_renew_changes_nothing",
            "2 owner-only",
            always,
            ownership::forged_renew_changes_nothing
        ),
        scenario!(
            "ownership/late_release_keeps_new_holder",
            "2 owner-only",
            ttl_expiry,
            ownership::late_release_keeps_new_holder
        ),
        scenario!(
            "ownership/late_renew_keeps_new_holder",
            "2 owner-only",
            ttl_expiry,
            ownership::late_renew_keeps_new_holder
        ),
        scenario!(
            "fencing/increase_across_holders",
            "3 fencing",
            always,
            fencing::fences_increase_across_holders
        ),
        scenario!(
            "fencing/increase_across_expiry",
            "3 fencing",
            ttl_expiry,
            fencing::fences_increase_across_expiry
        ),
        scenario!(
            "fencing/increase_after_revoke",
            "3 fencing",
            always,
            fencing::fences_increase_after_revoke
        ),
        scenario!(
            "expiry/frees_lock_without_cleanup",
            "4 expiry",
            ttl_expiry,
            expiry::expiry_frees_lock
        ),
        scenario!(
            "expiry/extend_prolongs_lease",
            "4 expiry, extend",
            ttl_expiry,
            expiry::extend_prolongs_lease
        ),
        scenario!(
            "waiting/budget_is_honoured",
            "5 waiting",
            always,
            waiting::wait_budget_is_honoured
        ),
        scenario!(
            "waiting/zero_budget_is_one_try",
            "5 waiting",
            always,
            waiting::zero_budget_is_one_try
        ),
        scenario!(
            "waiting/release_wakes_waiter_promptly",
            "5 waiting",
            always,
            waiting::release_wakes_waiter_promptly
        ),
        scenario!(
            "waiting/fifo_order_where_declared",
            "5 waiting, WaitOrder::Fifo",
            fifo,
            waiting::fifo_order_where_declared
        ),
        scenario!(
            "waiting/no_client_starves",
            "5 waiting, WaitOrder::Fifo or Fair",
            starvation_free,
            waiting::no_client_starves
        ),
        scenario!(
            "reentrancy/depth_needs_as_many_releases",
            "6 reentrancy",
            always,
            reentrancy::depth_needs_as_many_releases
        ),
        scenario!(
            "reentrancy/clones_share_identity",
            "6 reentrancy",
            always,
            reentrancy::clones_share_identity_strangers_excluded
        ),
        scenario!(
            "reentrancy/concurrent_reentry",
            "6 reentrancy",
            always,
            reentrancy::concurrent_reentry_does_not_deadlock
        ),
        scenario!(
            "lost/fires_when_taken_away",
            "7 lost signal",
            always,
            loss::lost_fires_when_lock_is_taken_away
        ),
        scenario!(
            "lost/fires_at_local_deadline",
            "7 lost signal",
            always,
            loss::lost_fires_at_local_deadline
        ),
        scenario!(
            "lost/resolves_on_release",
            "7 lost signal",
            always,
            loss::lost_future_resolves_on_release
        ),
        scenario!(
            "lost/release_is_not_a_loss",
            "7 lost signal",
            always,
            loss::release_is_not_reported_as_loss
        ),
        scenario!(
            "watchdog/keeps_lock_past_ttls",
            "8 watchdog",
            always,
            watchdog::keeps_lock_past_ttls
        ),
        scenario!(
            "watchdog/stops_after_release_and_drop",
            "8 watchdog",
            always,
            watchdog::stops_after_release_and_drop
        ),
        scenario!(
            "watchdog/stops_at_max_hold",
            "8 watchdog",
            always,
            watchdog::stops_at_max_hold
        ),
        scenario!(
            "watchdog/batches_renewals",
            "8 watchdog",
            always,
            watchdog::batches_renewals
        ),
        scenario!(
            "watchdog/extend_during_renewal",
            "1, 8 extend vs watchdog",
            always,
            watchdog::extend_during_renewal
        ),
        scenario!(
            "cancel/dropped_waiter_leaves_nothing",
            "9 cancellation",
            always,
            cancellation::dropped_waiter_leaves_nothing
        ),
        scenario!(
            "cancel/dropped_acquire_leaves_nothing",
            "9 cancellation",
            always,
            cancellation::dropped_acquire_leaves_nothing_beyond_ttl
        ),
        scenario!(
            "cancel/cancelled_release_still_releases",
            "9, 10 cancellation",
            always,
            cancellation::cancelled_release_still_releases
        ),
        scenario!(
            "drop/dropping_guard_releases",
            "10 drop",
            always,
            dropping::dropping_guard_releases
        ),
        scenario!(
            "drop/guard_dropped_on_foreign_thread",
            "10 drop",
            always,
            dropping::guard_dropped_on_foreign_thread_releases
        ),
        scenario!(
            "process/killed_holder_loses_lock",
            "4, 7 process death",
            cross_process,
            process::killed_holder_process_loses_lock
        ),
        scenario!(
            "errors/invalid_names_rejected",
            "11 errors",
            always,
            input::invalid_names_are_rejected
        ),
        scenario!(
            "errors/invalid_options_change_nothing",
            "11 errors",
            always,
            input::invalid_options_change_nothing
        ),
        scenario!(
            "errors/extreme_options_never_panic",
            "11 errors",
            always,
            input::extreme_options_never_panic
        ),
        scenario!(
            "errors/foreign_value_is_an_error",
            "11 errors",
            foreign,
            input::foreign_value_is_an_error
        ),
        scenario!(
            "leaks/nothing_left_after_release",
            "12 no leaks",
            always,
            leftovers::nothing_left_after_release
        ),
        scenario!(
            "leaks/names_map_to_distinct_locks",
            "names",
            always,
            leftovers::names_map_to_distinct_locks
        ),
        scenario!(
            "leases/inspect_reports_the_holder",
            "inspect",
            always,
            leases::inspect_reports_the_holder
        ),
        scenario!(
            "leases/portable_lease_moves",
            "portable leases",
            portable,
            leases::portable_lease_moves_between_clients
        ),
        // Last: an outage restarts servers, and some come back empty.
        scenario!(
            "errors/outage_retried_within_budget",
            "5 waiting, 11 errors: outages",
            outages,
            outage::outage_is_retried_within_the_budget
        ),
    ]
}
