//! The server secret key, and what is built from it: replayable responses
//! sealed for storage, and webhook signing secrets derived per task.
//!
//! # Why a server key
//!
//! Two things must be usable by the server later and yet unreadable from a
//! database dump:
//!
//! - **Idempotent replays.** A retried `POST /api/v1/tasks` must hand back
//!   the first answer, and that answer carries the agent token, which the
//!   store otherwise keeps only as a digest. The replay record is therefore
//!   sealed with an AEAD (ChaCha20-Poly1305, a fresh random nonce per
//!   record, the record's scope and key as associated data so a sealed
//!   answer cannot be moved to another key) under a key derived from the
//!   server key, and deleted when its window ends. A dump shows ciphertext;
//!   the token is readable only with the key, which lives in configuration
//!   (a Kubernetes Secret), not in the database.
//! - **Webhook secrets.** The controller must sign every delivery with the
//!   task's `whsec_` secret, so a digest is not enough. Nothing is stored at
//!   all: the secret is `HMAC-SHA256(derived key, task id)`, recomputed by
//!   whoever holds the server key (the API server when it shows the secret
//!   once at creation, the controller when it signs). A dump has nothing to
//!   steal, and the secret can be rotated only by rotating the server key.
//!
//! Each use gets its own subkey (`HMAC(server key, purpose)`), so the same
//! key never serves two purposes.
//!
//! Rotating `MEATSPACE_SECRET_KEY` invalidates pending replays (a retry then
//! runs again as a new request) and changes every webhook secret; agents
//! must then be given new ones, so keep the key stable.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

/// Shortest accepted `MEATSPACE_SECRET_KEY`, in characters: 32 random
/// characters carry far more than 128 bits.
pub const MIN_KEY_CHARS: usize = 32;
/// Name of the key file in the embedded default's data directory.
pub const KEY_FILE: &str = "secret.key";

const NONCE_LEN: usize = 12;

/// The server secret key. `Debug` never shows it.
#[derive(Clone, derive_more::Debug)]
pub struct ServerKey(#[debug(skip)] [u8; 32]);

/// Constant time, like every comparison of secrets here.
impl PartialEq for ServerKey {
    fn eq(&self, other: &Self) -> bool {
        subtle::ConstantTimeEq::ct_eq(&self.0[..], &other.0[..]).into()
    }
}

impl Eq for ServerKey {}

/// Why a key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("the secret key must be at least {MIN_KEY_CHARS} characters long")]
    TooShort,
    #[error("key file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A sealed record could not be opened: wrong key (rotated), or tampered.
#[derive(Debug, thiserror::Error)]
#[error("the sealed record cannot be opened with this key")]
pub struct OpenError;

impl ServerKey {
    /// A key from its configured text (any string of at least
    /// [`MIN_KEY_CHARS`] characters, e.g. `openssl rand -base64 32`).
    pub fn from_text(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        if text.chars().count() < MIN_KEY_CHARS {
            return Err(KeyError::TooShort);
        }
        Ok(ServerKey(Sha256::digest(text.as_bytes()).into()))
    }

    /// A fresh random key and its text form.
    pub fn generate() -> (Self, String) {
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let text = STANDARD.encode(bytes);
        let key = ServerKey::from_text(&text).expect("44 characters");
        (key, text)
    }

    /// The embedded default: reads `dir/secret.key`, or creates it (mode
    /// 0600, created exclusively so two processes starting at once agree
    /// on one key) when it does not exist.
    pub fn load_or_create(dir: &Path) -> Result<Self, KeyError> {
        let path = dir.join(KEY_FILE);
        let text =
            private_file(&path, || ServerKey::generate().1).map_err(|source| KeyError::Io {
                path: path.display().to_string(),
                source,
            })?;
        ServerKey::from_text(&text)
    }

    /// `HMAC-SHA256(key, purpose)`: a subkey for one purpose.
    fn subkey(&self, purpose: &str) -> [u8; 32] {
        let mut mac =
            <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Seals `plaintext` for storage, bound to `context` (authenticated,
    /// not stored): nonce followed by ciphertext and tag.
    pub fn seal(&self, context: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let cipher = ChaCha20Poly1305::new(&self.subkey("meatspace idempotent replay v1").into());
        let nonce = ChaCha20Poly1305::generate_nonce(&mut chacha20poly1305::aead::OsRng);
        let sealed = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad: context,
                },
            )
            .expect("ChaCha20-Poly1305 encrypts any length that fits in memory");
        let mut out = nonce.to_vec();
        out.extend(sealed);
        out
    }

    /// Opens what [`ServerKey::seal`] produced with the same `context`.
    pub fn open(&self, context: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
        if sealed.len() < NONCE_LEN {
            return Err(OpenError);
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let cipher = ChaCha20Poly1305::new(&self.subkey("meatspace idempotent replay v1").into());
        cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: context,
                },
            )
            .map_err(|_| OpenError)
    }

    /// The task's webhook signing secret, as shown to the agent
    /// (`whsec_<base64 of 32 bytes>`, the Standard Webhooks format).
    pub fn webhook_secret(&self, task_id: Uuid) -> String {
        format!(
            "whsec_{}",
            STANDARD.encode(self.webhook_secret_bytes(task_id))
        )
    }

    /// The raw bytes behind [`ServerKey::webhook_secret`], the HMAC key of
    /// the signatures.
    pub fn webhook_secret_bytes(&self, task_id: Uuid) -> [u8; 32] {
        let mut mac =
            <HmacSha256 as Mac>::new_from_slice(&self.subkey("meatspace webhook secret v1"))
                .expect("HMAC takes any key length");
        mac.update(task_id.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

impl ServerKey {
    /// The token of a worker's unsubscribe link for one channel
    /// (base64url, no padding): it proves the link came from this server
    /// without a sign-in, and it never changes, so an old message's link
    /// still works.
    pub fn unsubscribe_token(&self, worker: Uuid, channel: &str) -> String {
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.subkey("meatspace unsubscribe v1"))
            .expect("HMAC takes any key length");
        mac.update(worker.as_bytes());
        mac.update(channel.as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }

    /// Whether `token` is [`ServerKey::unsubscribe_token`] of the worker
    /// and channel, compared in constant time.
    pub fn unsubscribe_token_is(&self, worker: Uuid, channel: &str, token: &str) -> bool {
        let expected = self.unsubscribe_token(worker, channel);
        subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), token.as_bytes()).into()
    }

    /// Seed of the server's VAPID key (RFC 8292), the `counter`-th try:
    /// the key is derived, so every process with this server key signs
    /// with the same one and nothing more is kept. A seed that is not a
    /// valid P-256 scalar (odds of about 2^-32) is skipped by trying the
    /// next counter.
    pub fn vapid_seed(&self, counter: u8) -> [u8; 32] {
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.subkey("meatspace vapid key v1"))
            .expect("HMAC takes any key length");
        mac.update(&[counter]);
        mac.finalize().into_bytes().into()
    }
}

/// `v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>`: the
/// Standard Webhooks 1.0 signature of one delivery.
pub fn webhook_signature(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The text of the secret file at `path`, trimmed; if there is none, the
/// file is first created with `make()`'s text, readable by its owner only
/// (0600). Of several processes starting at once, one creates the file and
/// the others read what it wrote.
pub fn private_file(path: &Path, make: impl Fn() -> String) -> std::io::Result<String> {
    use std::io::{ErrorKind, Write};
    loop {
        match std::fs::read_to_string(path) {
            Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_owned()),
            // Another process created it and is still writing: the
            // interval of a poll that ends when it has written.
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let text = make();
                let mut options = std::fs::OpenOptions::new();
                options.write(true).create_new(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                match options.open(path) {
                    Ok(mut file) => {
                        file.write_all(text.as_bytes())?;
                        file.sync_all()?;
                        return Ok(text.trim().to_owned());
                    }
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ServerKey {
        ServerKey::from_text("0123456789abcdef0123456789abcdef").unwrap()
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(matches!(
            ServerKey::from_text("short"),
            Err(KeyError::TooShort)
        ));
    }

    #[test]
    fn sealed_records_open_only_with_the_same_key_and_context() {
        let k = key();
        let sealed = k.seal(b"scope/key", b"mst_secret");
        assert!(!sealed.windows(10).any(|w| w == b"mst_secret"));
        assert_eq!(k.open(b"scope/key", &sealed).unwrap(), b"mst_secret");
        assert!(k.open(b"scope/other", &sealed).is_err());
        let (other, _) = ServerKey::generate();
        assert!(other.open(b"scope/key", &sealed).is_err());
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(k.open(b"scope/key", &tampered).is_err());
        // A fresh nonce each time.
        assert_ne!(k.seal(b"scope/key", b"x"), k.seal(b"scope/key", b"x"));
    }

    #[test]
    fn webhook_secrets_are_stable_per_task_and_key() {
        let k = key();
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        assert_eq!(k.webhook_secret(a), k.webhook_secret(a));
        assert_ne!(k.webhook_secret(a), k.webhook_secret(b));
        assert!(k.webhook_secret(a).starts_with("whsec_"));
        let (other, _) = ServerKey::generate();
        assert_ne!(other.webhook_secret(a), k.webhook_secret(a));
    }

    /// The example of the Standard Webhooks specification's reference
    /// libraries: secret `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`, id
    /// `msg_p5jXN8AQM9LWM0D4loKWxJek`, timestamp 1614265330, body
    /// `{"test": 2432232314}`.
    #[test]
    fn signatures_match_the_standard_webhooks_example() {
        let secret = STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            webhook_signature(
                &secret,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn the_key_file_is_created_once() {
        let dir = tempfile_dir();
        let a = ServerKey::load_or_create(&dir).unwrap();
        let b = ServerKey::load_or_create(&dir).unwrap();
        assert_eq!(a.0, b.0);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_private_file_is_made_once_for_its_owner_only() {
        let dir = tempfile_dir();
        let path = dir.join("secret");
        let first = private_file(&path, || "first\n".into()).unwrap();
        assert_eq!(first, "first");
        assert_eq!(private_file(&path, || "second\n".into()).unwrap(), "first");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("meatspace-key-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
