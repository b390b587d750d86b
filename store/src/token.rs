//! Bearer credentials: generated at random, shown once, stored only as a
//! SHA-256 digest and compared in constant time.
//!
//! The tokens carry 256 bits of entropy, so a fast hash is enough: there is
//! nothing to brute-force that a slow KDF would protect.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// SHA-256 digest of a credential, the only form the store keeps.
#[derive(Clone, PartialEq, Eq, derive_more::Debug)]
pub struct TokenHash(#[debug(skip)] pub [u8; 32]);

impl TokenHash {
    /// Digest of a presented credential.
    pub fn of(secret: &str) -> Self {
        TokenHash(Sha256::digest(secret.as_bytes()).into())
    }

    /// Rebuilds a digest read from the database; `None` if the length is wrong.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(TokenHash)
    }

    /// Constant-time check that `secret` hashes to this digest.
    pub fn verify(&self, secret: &str) -> bool {
        TokenHash::of(secret).0.ct_eq(&self.0).into()
    }
}

/// Returns a new random credential with a recognisable prefix
/// (`mst_` agent tokens, `msw_` worker tokens) so leaked tokens are easy to
/// spot by secret scanners.
pub fn generate(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// Prefix of agent tokens.
pub const AGENT_PREFIX: &str = "mst_";

/// A new credential that names its subject (a task or a worker):
/// `<prefix><id, 32 hex digits>_<random>`, so that the server finds the
/// digest to compare by the id alone.
pub fn generate_for(prefix: &str, id: uuid::Uuid) -> String {
    format!("{prefix}{}_{}", id.simple(), generate(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_only_the_same_secret() {
        let t = generate("mst_");
        assert!(t.starts_with("mst_") && t.len() > 40);
        let h = TokenHash::of(&t);
        assert!(h.verify(&t));
        assert!(!h.verify(&format!("{t}x")));
        assert!(!h.verify(""));
        assert_ne!(generate("mst_"), t);
    }

    #[test]
    fn debug_hides_the_digest() {
        assert_eq!(format!("{:?}", TokenHash::of("x")), "TokenHash(..)");
    }
}
