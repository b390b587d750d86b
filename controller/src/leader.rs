//! Leader election through a `coordination.k8s.io/v1` Lease, for the work
//! that must not run twice: the Kubernetes mirror. (Expiry and retention
//! need none: row locks already split their work between replicas.)
//!
//! The holder renews the Lease every third of its duration; another replica
//! takes it over only once `renewTime + leaseDurationSeconds` has passed.
//! Every write carries the Lease's `resourceVersion`, so when two replicas
//! race for an expired Lease the apiserver accepts exactly one of them.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

use crate::Shutdown;

/// Which Lease to hold, and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// How long a holder that stops renewing keeps the Lease.
    pub duration: Duration,
}

/// What to write to the Lease now, if anything: `None` means another
/// replica holds it and it has not expired. Pure, so it is unit-tested.
fn claim(spec: &LeaseSpec, me: &str, now: Timestamp, duration: Duration) -> Option<LeaseSpec> {
    let holder = spec.holder_identity.as_deref();
    let ours = holder == Some(me);
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(MicroTime(renewed)), Some(secs)) => {
            renewed.as_millisecond() + i64::from(secs) * 1000 <= now.as_millisecond()
        }
        _ => true,
    };
    if !(ours || holder.is_none() || expired) {
        return None;
    }
    let transitions = spec.lease_transitions.unwrap_or(0);
    Some(LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX).max(1)),
        acquire_time: if ours {
            spec.acquire_time.clone()
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours { transitions } else { transitions + 1 }),
        ..LeaseSpec::default()
    })
}

/// One attempt to take or renew the Lease. `Ok(true)` means we hold it.
async fn try_hold(api: &Api<Lease>, s: &LeaseSettings) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    match api.get_opt(&s.name).await? {
        None => {
            let Some(spec) = claim(&LeaseSpec::default(), &s.identity, now, s.duration) else {
                return Ok(false);
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let current = lease.spec.clone().unwrap_or_default();
            let Some(spec) = claim(&current, &s.identity, now, s.duration) else {
                return Ok(false);
            };
            lease.spec = Some(spec);
            // `lease` keeps the resourceVersion we read: a concurrent writer
            // makes this replace fail with 409 instead of both winning.
            match api.replace(&s.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Holds the Lease until shutdown, publishing whether this replica leads.
/// A replica that cannot renew in time steps down before its Lease could
/// pass to another, so two leaders never overlap by more than clock skew.
pub(crate) async fn run(
    client: kube::Client,
    settings: LeaseSettings,
    leading: watch::Sender<bool>,
    mut shutdown: Shutdown,
) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let renew_every = settings.duration / 3;
    let mut last_held = None::<tokio::time::Instant>;
    while !shutdown.is_requested() {
        let held = match try_hold(&api, &settings).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, lease = %settings.name, "lease renewal failed");
                // Keep leading only while the last renewal is still valid.
                last_held.is_some_and(|t| t.elapsed() < settings.duration * 2 / 3)
            }
        };
        if held {
            last_held = Some(tokio::time::Instant::now());
        }
        leading.send_if_modified(|was| {
            let changed = *was != held;
            if changed {
                tracing::info!(lease = %settings.name, identity = %settings.identity, leading = held, "leadership changed");
            }
            *was = held;
            changed
        });
        tokio::select! {
            () = tokio::time::sleep(renew_every) => {}
            // Also resolves when the shutdown sender is gone: without this
            // break the loop would spin, renewing as fast as it can.
            () = shutdown.requested() => break,
        }
    }
    // Step down so a successor need not wait out the Lease.
    if *leading.borrow() {
        if let Ok(Some(mut lease)) = api.get_opt(&settings.name).await
            && let Some(spec) = lease
                .spec
                .as_mut()
                .filter(|s| s.holder_identity.as_deref() == Some(&settings.identity))
        {
            spec.holder_identity = None;
            spec.renew_time = None;
            let _ = api
                .replace(&settings.name, &PostParams::default(), &lease)
                .await;
        }
        let _ = leading.send(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).expect("valid timestamp")
    }

    fn held_by(who: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(renewed))),
            acquire_time: Some(MicroTime(at(0))),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn free_or_expired_leases_are_taken_and_counted() {
        let spec = claim(&LeaseSpec::default(), "a", at(0), D).expect("free lease");
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
        assert_eq!(spec.lease_transitions, Some(1));
        let spec = claim(&held_by("b", 0), "a", at(15), D).expect("expired lease");
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(at(15))));
    }

    #[test]
    fn a_live_lease_of_another_is_left_alone() {
        assert_eq!(claim(&held_by("b", 0), "a", at(14), D), None);
    }

    #[test]
    fn the_holder_renews_without_a_transition() {
        let spec = claim(&held_by("a", 0), "a", at(5), D).expect("own lease");
        assert_eq!(spec.renew_time, Some(MicroTime(at(5))));
        assert_eq!(spec.acquire_time, Some(MicroTime(at(0))));
        assert_eq!(spec.lease_transitions, Some(3));
    }
}
