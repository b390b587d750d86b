//! Web Push (RFC 8030) to the worker app: each message encrypted for the
//! browser's subscription (RFC 8291, `aes128gcm`) and signed with the
//! server's VAPID key (RFC 8292), by web-push-native on RustCrypto.
//!
//! The VAPID key is derived from the server key, so the API server (which
//! hands browsers its public half to subscribe with) and every controller
//! agree on it without storing another secret; a new server key is a new
//! VAPID key, and browsers subscribe again when the app next opens.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use meatspace_domain::notify;
use meatspace_store::Store;
use meatspace_store::notify::PushSubscription;
use meatspace_store::secret::ServerKey;
use web_push_native::jwt_simple::algorithms::ES256KeyPair;
use web_push_native::p256::{self, elliptic_curve::sec1::ToEncodedPoint};
use web_push_native::{Auth, WebPushBuilder};

use super::{NotifySettings, Sent};
use crate::Error;
use crate::webhooks::{AllowList, checked_client, describe, refused_literal};

/// How long a push service keeps a message for a browser that is offline.
const TTL: Duration = Duration::from_secs(24 * 3600);

/// The server's VAPID key pair, derived from the server key.
fn vapid_secret(key: &ServerKey) -> p256::SecretKey {
    (0..=u8::MAX)
        .find_map(|counter| p256::SecretKey::from_bytes(&key.vapid_seed(counter).into()).ok())
        .expect("one of 256 derived seeds is a P-256 scalar")
}

/// The public half of the server's VAPID key as browsers take it
/// (`applicationServerKey`): the uncompressed point, base64url.
pub fn vapid_public_key(key: &ServerKey) -> String {
    let point = vapid_secret(key).public_key().to_encoded_point(false);
    URL_SAFE_NO_PAD.encode(point.as_bytes())
}

/// How long a VAPID signature is reused for one push service (it is
/// valid for [`TTL`]): signing is the costliest step of a push.
const SIGNATURE_REUSE: Duration = Duration::from_secs(3600);

/// The push sender.
pub(crate) struct Push {
    key_pair: ES256KeyPair,
    contact: String,
    allow: AllowList,
    client: reqwest::Client,
    /// Signatures made, per push service origin, with when.
    signatures: std::sync::Mutex<
        std::collections::HashMap<String, (std::time::Instant, reqwest::header::HeaderValue)>,
    >,
}

/// What one subscription's push did.
enum One {
    Delivered,
    Gone,
    Failed { transient: bool, error: String },
}

impl Push {
    pub(crate) fn new(key: &ServerKey, settings: &NotifySettings) -> Result<Push, String> {
        let key_pair = ES256KeyPair::from_bytes(&vapid_secret(key).to_bytes())
            .map_err(|e| format!("the VAPID key: {e}"))?;
        let client = checked_client(
            &settings.push_allow,
            settings.timeout,
            concat!("meatspace-push/", env!("CARGO_PKG_VERSION")),
        )
        .map_err(|e| format!("the push client: {e}"))?;
        Ok(Push {
            key_pair,
            contact: settings.push_contact.clone(),
            allow: settings.push_allow.clone(),
            client,
            signatures: Default::default(),
        })
    }

    /// `Authorization: vapid t=<JWT>, k=<public key>` for a push to `url`
    /// (RFC 8292). The audience is the endpoint's origin, port included
    /// (web-push-native's own signer leaves a non-default port out, which
    /// a push service on one would refuse).
    fn vapid(&self, url: &url::Url) -> Result<reqwest::header::HeaderValue, String> {
        use web_push_native::jwt_simple::prelude::*;
        let origin = url.origin().ascii_serialization();
        let mut signatures = self
            .signatures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((made, value)) = signatures.get(&origin)
            && made.elapsed() < SIGNATURE_REUSE
        {
            return Ok(value.clone());
        }
        // A push service per origin: the map stays as small as the set
        // of push services browsers use.
        signatures.retain(|_, (made, _)| made.elapsed() < SIGNATURE_REUSE);
        let claims = Claims::create(TTL.into())
            .with_audience(&origin)
            .with_subject(&self.contact);
        let token = self.key_pair.sign(claims).map_err(|e| e.to_string())?;
        let key = URL_SAFE_NO_PAD.encode(
            self.key_pair
                .public_key()
                .public_key()
                .to_bytes_uncompressed(),
        );
        let value = reqwest::header::HeaderValue::try_from(format!("vapid t={token}, k={key}"))
            .map_err(|e| e.to_string())?;
        signatures.insert(origin, (std::time::Instant::now(), value.clone()));
        Ok(value)
    }

    /// Sends the message to every subscription of a worker; removes those
    /// the push service says are gone. Delivered when any browser got it.
    pub(crate) async fn send_all(
        &self,
        store: &dyn Store,
        subscriptions: &[PushSubscription],
        message: &notify::Message,
        link: &str,
        id: i64,
    ) -> Result<Sent, Error> {
        // The id is the notification's: a message sent again (a crash
        // between sending and recording) carries the same one, and the
        // service worker shows it under one tag, replacing the first.
        let payload = serde_json::json!({
            "id": id,
            "title": message.title,
            "body": message.body,
            "url": link,
        })
        .to_string();
        let mut delivered = false;
        let mut failure: Option<(bool, String)> = None;
        for subscription in subscriptions {
            match self.send(subscription, &payload).await {
                One::Delivered => delivered = true,
                One::Gone => {
                    crate::metrics::push_subscription_removed();
                    store
                        .remove_push_subscription(None, &subscription.endpoint)
                        .await?;
                }
                One::Failed { transient, error } => {
                    // One transient failure is reason enough to try again.
                    let transient = transient || failure.as_ref().is_some_and(|(t, _)| *t);
                    failure = Some((transient, error));
                }
            }
        }
        Ok(match (delivered, failure) {
            (true, _) => Sent::Delivered,
            (false, Some((transient, error))) => Sent::Failed { transient, error },
            (false, None) => Sent::Nowhere,
        })
    }

    async fn send(&self, subscription: &PushSubscription, payload: &str) -> One {
        let failed = |error: String| One::Failed {
            transient: false,
            error,
        };
        let url = match meatspace_domain::webhook_url::parse_url(&subscription.endpoint) {
            Ok(url) => url,
            Err(e) => return failed(format!("the endpoint: {e}")),
        };
        if let Some(refused) = refused_literal(&url, &self.allow) {
            return failed(refused.to_string());
        }
        let keys = (
            URL_SAFE_NO_PAD
                .decode(subscription.p256dh.trim_end_matches('='))
                .ok()
                .and_then(|b| p256::PublicKey::from_sec1_bytes(&b).ok()),
            URL_SAFE_NO_PAD
                .decode(subscription.auth.trim_end_matches('='))
                .ok()
                .filter(|b| b.len() == 16),
        );
        let (Some(ua_public), Some(auth)) = keys else {
            return failed(
                "the subscription's keys are not a P-256 key and a 16-byte secret".into(),
            );
        };
        let Ok(endpoint) = url.as_str().parse() else {
            return failed("the endpoint is not a URI".into());
        };
        let request = WebPushBuilder::new(endpoint, ua_public, Auth::clone_from_slice(&auth))
            .with_valid_duration(TTL)
            .build(payload.as_bytes().to_vec());
        let mut request = match request.map(reqwest::Request::try_from) {
            Ok(Ok(request)) => request,
            Ok(Err(e)) => return failed(format!("the request: {e}")),
            Err(e) => return failed(format!("encrypting: {e}")),
        };
        match self.vapid(&url) {
            Ok(authorization) => {
                request
                    .headers_mut()
                    .insert(reqwest::header::AUTHORIZATION, authorization);
            }
            Err(e) => return failed(format!("signing: {e}")),
        }
        match self.client.execute(request).await {
            Ok(res) if res.status().is_success() => One::Delivered,
            Ok(res)
                if matches!(
                    res.status(),
                    reqwest::StatusCode::NOT_FOUND | reqwest::StatusCode::GONE
                ) =>
            {
                One::Gone
            }
            Ok(res) => One::Failed {
                // 429 and 5xx pass; anything else is this message's fault.
                transient: res.status() == reqwest::StatusCode::TOO_MANY_REQUESTS
                    || res.status().is_server_error(),
                error: format!("the push service answered {}", res.status()),
            },
            Err(e) => One::Failed {
                transient: true,
                error: describe(&e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vapid_key_is_derived_from_the_server_key_alone() {
        let (key, _) = ServerKey::generate();
        let public = vapid_public_key(&key);
        assert_eq!(public, vapid_public_key(&key));
        // An uncompressed P-256 point: 65 bytes, 0x04 first.
        let bytes = URL_SAFE_NO_PAD.decode(&public).unwrap();
        assert_eq!((bytes.len(), bytes[0]), (65, 4));
        let (other, _) = ServerKey::generate();
        assert_ne!(public, vapid_public_key(&other));
    }
}
