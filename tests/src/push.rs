//! A push service of the test's own, on 127.0.0.1: it hands out
//! subscriptions as a browser would (a P-256 key pair and an auth secret
//! per subscription), and for each message it receives it checks the VAPID
//! signature (RFC 8292) against the key the server publishes and decrypts
//! the body (RFC 8291, `aes128gcm`) with the subscription's private key.
//! The decryption here is written from the RFCs on RustCrypto primitives,
//! independently of the server's library, so a message the server
//! encrypted wrongly fails here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes128Gcm, Nonce};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hkdf::Hkdf;
use p256::ecdsa::signature::Verifier;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use sha2::Sha256;
use tokio::net::TcpListener;

/// A subscription as the browser would send it to the server.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub endpoint: String,
    pub p256dh: String,
    pub auth: String,
}

impl Subscription {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "endpoint": self.endpoint,
            "keys": { "p256dh": self.p256dh, "auth": self.auth },
        })
    }
}

#[derive(Default)]
struct Inner {
    keys: HashMap<String, (p256::SecretKey, [u8; 16])>,
    /// Decrypted payloads per subscription id.
    received: HashMap<String, Vec<serde_json::Value>>,
    /// Answers other than 201, per subscription id (e.g. 410).
    answer: HashMap<String, StatusCode>,
    /// Messages refused, with why.
    refused: Vec<String>,
}

/// The receiver; serves until the test's runtime ends.
#[derive(Clone)]
pub struct PushService {
    pub origin: String,
    /// The VAPID public key (base64url) the server publishes.
    vapid_key: String,
    inner: Arc<Mutex<Inner>>,
}

impl PushService {
    /// Starts the service; messages must be signed with `vapid_key`.
    pub async fn start(vapid_key: &str) -> PushService {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let origin = format!("http://{}", listener.local_addr().expect("address"));
        let service = PushService {
            origin,
            vapid_key: vapid_key.to_owned(),
            inner: Arc::default(),
        };
        let app = axum::Router::new()
            .route("/push/{id}", axum::routing::post(receive))
            .with_state(service.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        service
    }

    /// A new subscription, as a browser's push manager makes one.
    pub fn subscribe(&self) -> Subscription {
        let secret = loop {
            if let Ok(k) = p256::SecretKey::from_bytes(&rand::random::<[u8; 32]>().into()) {
                break k;
            }
        };
        let auth: [u8; 16] = rand::random();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let public = secret.public_key().to_encoded_point(false);
        let subscription = Subscription {
            endpoint: format!("{}/push/{id}", self.origin),
            p256dh: URL_SAFE_NO_PAD.encode(public.as_bytes()),
            auth: URL_SAFE_NO_PAD.encode(auth),
        };
        self.inner.lock().unwrap().keys.insert(id, (secret, auth));
        subscription
    }

    /// Answers `status` to every message for `subscription` from now on.
    pub fn answer(&self, subscription: &Subscription, status: StatusCode) {
        let id = id_of(subscription);
        self.inner.lock().unwrap().answer.insert(id, status);
    }

    /// The payloads received for `subscription`, decrypted.
    pub fn received(&self, subscription: &Subscription) -> Vec<serde_json::Value> {
        let id = id_of(subscription);
        self.inner
            .lock()
            .unwrap()
            .received
            .get(&id)
            .cloned()
            .unwrap_or_default()
    }

    /// How many messages were received in all.
    pub fn total(&self) -> usize {
        self.inner
            .lock()
            .unwrap()
            .received
            .values()
            .map(Vec::len)
            .sum()
    }

    /// Messages refused (bad signature, undecryptable), with why.
    pub fn refused(&self) -> Vec<String> {
        self.inner.lock().unwrap().refused.clone()
    }
}

impl std::fmt::Debug for PushService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushService")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

fn id_of(subscription: &Subscription) -> String {
    subscription
        .endpoint
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned()
}

async fn receive(
    State(service): State<PushService>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let keys = service.inner.lock().unwrap().keys.get(&id).cloned();
    let Some((secret, auth)) = keys else {
        return StatusCode::NOT_FOUND;
    };
    if let Some(status) = service.inner.lock().unwrap().answer.get(&id) {
        return *status;
    }
    let checked = check_vapid(&headers, &service.vapid_key, &service.origin)
        .and_then(|()| {
            (headers
                .get("content-encoding")
                .and_then(|v| v.to_str().ok())
                == Some("aes128gcm"))
            .then_some(())
            .ok_or_else(|| "Content-Encoding is not aes128gcm".to_owned())
        })
        .and_then(|()| decrypt(&body, &secret, &auth))
        .and_then(|plain| serde_json::from_slice(&plain).map_err(|e| format!("payload: {e}")));
    let mut inner = service.inner.lock().unwrap();
    match checked {
        Ok(payload) => {
            inner.received.entry(id).or_default().push(payload);
            StatusCode::CREATED
        }
        Err(why) => {
            inner.refused.push(why);
            StatusCode::BAD_REQUEST
        }
    }
}

/// `Authorization: vapid t=<JWT>, k=<key>`: the key is the server's, the
/// JWT is ES256-signed by it, for this origin, not expired, with a contact.
fn check_vapid(headers: &HeaderMap, expected_key: &str, origin: &str) -> Result<(), String> {
    let value = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or("no Authorization header")?;
    let rest = value
        .strip_prefix("vapid ")
        .ok_or("not a vapid Authorization")?;
    let mut token = None;
    let mut key = None;
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(t) = part.strip_prefix("t=") {
            token = Some(t);
        } else if let Some(k) = part.strip_prefix("k=") {
            key = Some(k);
        }
    }
    let (token, key) = (token.ok_or("no t=")?, key.ok_or("no k=")?);
    if key != expected_key {
        return Err("k= is not the server's published VAPID key".into());
    }
    let verifying = p256::ecdsa::VerifyingKey::from_sec1_bytes(
        &URL_SAFE_NO_PAD.decode(key).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the JWT has not three parts".into());
    };
    let signature = p256::ecdsa::Signature::from_slice(
        &URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    verifying
        .verify(format!("{header}.{claims}").as_bytes(), &signature)
        .map_err(|_| "the VAPID signature does not verify".to_owned())?;
    let header: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    if header["alg"] != "ES256" {
        return Err(format!("alg is {}", header["alg"]));
    }
    let claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    if claims["aud"] != origin {
        return Err(format!("aud is {}, not {origin}", claims["aud"]));
    }
    let now = chrono::Utc::now().timestamp();
    let exp = claims["exp"].as_i64().ok_or("no exp")?;
    if exp <= now || exp > now + 24 * 3600 + 60 {
        return Err(format!("exp {exp} is not within 24 h of now"));
    }
    let sub = claims["sub"].as_str().ok_or("no sub")?;
    if !(sub.starts_with("mailto:") || sub.starts_with("https:")) {
        return Err(format!("sub {sub} is not a contact"));
    }
    Ok(())
}

/// RFC 8291 over RFC 8188: one record.
fn decrypt(body: &[u8], secret: &p256::SecretKey, auth: &[u8; 16]) -> Result<Vec<u8>, String> {
    if body.len() < 21 {
        return Err("body shorter than the aes128gcm header".into());
    }
    let salt = &body[..16];
    let idlen = body[20] as usize;
    let keyid = body.get(21..21 + idlen).ok_or("keyid cut short")?;
    let ciphertext = &body[21 + idlen..];
    let as_public = p256::PublicKey::from_sec1_bytes(keyid).map_err(|_| "keyid is no P-256 key")?;
    let shared = p256::ecdh::diffie_hellman(secret.to_nonzero_scalar(), as_public.as_affine());
    let ua_public = secret.public_key().to_encoded_point(false);
    let mut key_info = b"WebPush: info\0".to_vec();
    key_info.extend_from_slice(ua_public.as_bytes());
    key_info.extend_from_slice(keyid);
    let mut ikm = [0u8; 32];
    Hkdf::<Sha256>::new(Some(auth), shared.raw_secret_bytes())
        .expand(&key_info, &mut ikm)
        .map_err(|e| e.to_string())?;
    let prk = Hkdf::<Sha256>::new(Some(salt), &ikm);
    let mut cek = [0u8; 16];
    let mut nonce = [0u8; 12];
    prk.expand(b"Content-Encoding: aes128gcm\0", &mut cek)
        .map_err(|e| e.to_string())?;
    prk.expand(b"Content-Encoding: nonce\0", &mut nonce)
        .map_err(|e| e.to_string())?;
    let plain = Aes128Gcm::new(&cek.into())
        .decrypt(Nonce::from_slice(&nonce), ciphertext)
        .map_err(|_| "the body does not decrypt with the subscription's key".to_owned())?;
    // The last record: content, the delimiter 0x02, then zero padding.
    let end = plain.iter().rposition(|&b| b != 0).ok_or("no delimiter")?;
    if plain[end] != 2 {
        return Err("the last record's delimiter is not 0x02".into());
    }
    Ok(plain[..end].to_vec())
}
