//! Leader election through a `coordination.k8s.io/v1` Lease, for the work
//! that must not run twice: the Kubernetes mirror. (Expiry and retention
//! need none: row locks already split their work between replicas.)
//!
//! The holder renews the Lease every third of its duration; another replica
//! takes it over only once `renewTime + leaseDurationSeconds` has passed.
//! Every write carries the Lease's `resourceVersion`, so when two replicas
//! race for an expired Lease the apiserver accepts exactly one of them.
//!
//! A holder judges its own lead by a local monotonic deadline taken before
//! each renewal request (see [`run`]), with a timeout on every renewal, so
//! a hung apiserver makes it stop mirroring before a follower may take the
//! Lease over; `meatspace_leader{lease,identity}` shows who leads.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

use tokio::time::Instant;

use crate::Shutdown;
use crate::error::KUBE_CALL_TIMEOUT;

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

/// Gauge of leadership: 1 while this replica (label `identity`) holds the
/// Lease (label `lease`) and may mirror, else 0.
pub const LEADER_GAUGE: &str = "meatspace_leader";

/// How long this replica may keep leading after the *start* of its last
/// successful renewal. Another replica takes over once the renewal time it
/// reads plus the Lease duration has passed on its clock; our renewal
/// time was taken just after this start, so stopping at two thirds of the
/// duration leaves a third (a second of a 3 s Lease) for clock skew and
/// for the follower's own polling.
fn leading_for(duration: Duration) -> Duration {
    duration * 2 / 3
}

/// Longest wait for one Lease renewal (a read and a write): a hung
/// apiserver must not keep the elector from noticing its deadline.
fn renewal_timeout(duration: Duration) -> Duration {
    (duration / 3).clamp(Duration::from_millis(500), KUBE_CALL_TIMEOUT)
}

/// Holds the Lease until shutdown, publishing whether this replica leads.
///
/// Leadership is judged by a local monotonic deadline, taken *before* each
/// renewal request is sent, never by the time a response arrives or by the
/// apiserver's clock: after a successful renewal that started at `t`, this
/// replica leads until `t + 2/3 × duration`. Every renewal has a timeout,
/// and the deadline is enforced while a renewal is in flight, so a hung
/// apiserver makes this replica step down (and the mirror stop) before
/// another replica may take the Lease over.
pub(crate) async fn run(
    client: kube::Client,
    settings: LeaseSettings,
    leading: watch::Sender<bool>,
    mut shutdown: Shutdown,
) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let renew_every = settings.duration / 3;
    let timeout = renewal_timeout(settings.duration);
    let publish = |held: bool| {
        metrics::gauge!(LEADER_GAUGE, "lease" => settings.name.clone(), "identity" => settings.identity.clone())
            .set(if held { 1.0 } else { 0.0 });
        leading.send_if_modified(|was| {
            let changed = *was != held;
            if changed {
                tracing::info!(lease = %settings.name, identity = %settings.identity, leading = held, "leadership changed");
            }
            *was = held;
            changed
        });
    };
    publish(false);
    // While leading: when leadership ends unless a renewal succeeds first.
    let mut lead_until: Option<Instant> = None;
    while !shutdown.is_requested() {
        let started = Instant::now();
        let expires = async {
            match lead_until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let attempt = tokio::time::timeout(timeout, try_hold(&api, &settings));
        let outcome = tokio::select! {
            biased;
            () = shutdown.requested() => break,
            () = expires => None,
            r = attempt => Some(r),
        };
        match outcome {
            Some(Ok(Ok(true))) => {
                lead_until = Some(started + leading_for(settings.duration));
                publish(true);
            }
            Some(Ok(Ok(false))) => {
                lead_until = None;
                publish(false);
            }
            Some(Ok(Err(e))) => {
                tracing::warn!(error = %e, lease = %settings.name, "lease renewal failed");
            }
            Some(Err(_)) => {
                tracing::warn!(lease = %settings.name, ?timeout, "lease renewal got no answer in time");
            }
            None => {}
        }
        if lead_until.is_some_and(|t| Instant::now() >= t) {
            tracing::warn!(lease = %settings.name, "lease not renewed in time: stepping down");
            lead_until = None;
            publish(false);
        }
        let next = started + renew_every;
        let step_down_at = lead_until.filter(|t| *t < next);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = async { tokio::time::sleep_until(step_down_at.unwrap_or(next)).await }, if step_down_at.is_some() => {
                tracing::warn!(lease = %settings.name, "lease not renewed in time: stepping down");
                lead_until = None;
                publish(false);
            }
            // Also resolves when the shutdown sender is gone: without this
            // break the loop would spin, renewing as fast as it can.
            () = shutdown.requested() => break,
        }
    }
    // Step down so a successor need not wait out the Lease.
    if *leading.borrow() {
        publish(false);
        let release = async {
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
        };
        let _ = tokio::time::timeout(timeout, release).await;
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
