//! The credential digests a server keeps in memory, and how a revocation
//! drops them on every replica.

use chrono::{DateTime, Utc};
use meatspace_store::StoreError;
use meatspace_store::token::TokenHash;
use uuid::Uuid;

/// Token digests already read from the store, by the id of the task or
/// worker a token names, so that a client's requests do not each read its
/// digest again: workers' in [`Credentials::workers`]
/// ([`DigestCache::for_workers`]), agents' in [`AppState`](crate::AppState)'s
/// `agent_digests` ([`DigestCache::for_agents`]). Only digests that exist are kept (read
/// from the store, or [remembered](DigestCache::remember) once the create
/// that stored them committed): an unknown id is read every time, so a
/// token is never refused on the word of the cache.
///
/// Why a cached digest gives the answer the store would give:
///
/// - **Worker tokens.** A worker is never removed, and its digest changes
///   only when an operator rotates its token; that rotation, like a
///   suspension, is announced and drops the entry (below). Otherwise kept
///   for good.
/// - **Agent tokens.** A task's digest is written once, when the task is
///   created, and never updated. Retention's purge deletes the task but
///   keeps the digest as a tombstone (`purged_tasks`), and
///   [`TaskReads::agent_token_hash`](meatspace_store::Store::agent_token_hash)
///   reads the tombstone too, so a purge does not change its answer:
///   the token still authenticates, and the command or read it authorizes
///   still goes to the store, which answers that the task is gone (404),
///   exactly as without the cache. The one change that does alter the
///   store's answer is forgetting the tombstone
///   ([`Store::forget_purged_before`](meatspace_store::Store::forget_purged_before),
///   30 days after the purge by default), after which the token is unknown
///   (401). So an agent digest is kept at most [`AGENT_DIGEST_MAX_AGE`]:
///   a token of a forgotten tombstone is told 404 rather than 401 for at
///   most that long, as a request that read the digest just before the
///   tombstone went would be.
///
/// A worker's token stops working when an operator suspends the worker or
/// rotates its token: the store announces it ([`Change::Credential`]) and
/// every process drops the entry ([`Credentials::forget`]); a read that
/// raced the revocation is not kept (the cache's generation moved).
///
/// [`Change::Credential`]: meatspace_store::Change::Credential
#[derive(Debug, Clone)]
pub struct DigestCache<V = TokenHash> {
    known: std::sync::Arc<std::sync::Mutex<Entries<V>>>,
    /// How long an entry is trusted after it was read; `None`: for good.
    max_age: Option<std::time::Duration>,
}

#[derive(Debug)]
struct Entries<V> {
    map: std::collections::HashMap<Uuid, Known<V>>,
    /// Bumped by every [`DigestCache::forget`] and [`DigestCache::clear`]:
    /// a read that started before it may have seen the credential as it
    /// was before the revocation, so its answer is not kept.
    generation: u64,
}

impl<V> Default for Entries<V> {
    fn default() -> Self {
        Entries {
            map: Default::default(),
            generation: 0,
        }
    }
}

#[derive(Debug, Clone)]
struct Known<V> {
    hash: V,
    read_at: std::time::Instant,
}

/// Digests kept at most per cache; when full, the map starts over.
const DIGESTS: usize = 100_000;

/// Longest an agent token digest is used after it was read (see
/// [`DigestCache`]).
pub const AGENT_DIGEST_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

impl DigestCache {
    /// For worker tokens: kept until the worker's credential changes
    /// ([`Credentials::forget`]).
    pub fn for_workers() -> Self {
        Self::new(None)
    }

    /// For agent tokens: kept at most [`AGENT_DIGEST_MAX_AGE`].
    pub fn for_agents() -> Self {
        Self::new(Some(AGENT_DIGEST_MAX_AGE))
    }
}

impl<V: Clone> DigestCache<V> {
    fn new(max_age: Option<std::time::Duration>) -> Self {
        DigestCache {
            known: Default::default(),
            max_age,
        }
    }

    /// Kept until forgotten.
    pub fn for_good() -> Self {
        Self::new(None)
    }

    /// The digest of `id`'s token: the kept one, or what `read` (the
    /// store's lookup) answers, kept when it exists and nothing was
    /// forgotten while it was read.
    pub async fn digest(
        &self,
        id: Uuid,
        read: impl std::future::Future<Output = Result<Option<V>, StoreError>>,
    ) -> Result<Option<V>, StoreError> {
        if let Some(hash) = self.get(id) {
            return Ok(Some(hash));
        }
        let read_at = std::time::Instant::now();
        let generation = self.lock().generation;
        let hash = read.await?;
        if let Some(hash) = &hash {
            self.insert(id, hash.clone(), read_at, Some(generation));
        }
        Ok(hash)
    }

    /// Keeps the digest of a token the caller has just stored (committed),
    /// as if it had been read now.
    pub fn remember(&self, id: Uuid, hash: V) {
        self.insert(id, hash, std::time::Instant::now(), None);
    }

    /// The kept digest of `id`'s token, without reading the store.
    pub fn cached(&self, id: Uuid) -> Option<V> {
        self.get(id)
    }

    /// Drops what is kept of `id`: its credential changed.
    pub fn forget(&self, id: Uuid) {
        let mut known = self.lock();
        known.map.remove(&id);
        known.generation += 1;
    }

    /// Drops everything: changes may have been missed.
    pub fn clear(&self) {
        let mut known = self.lock();
        known.map.clear();
        known.generation += 1;
    }

    fn get(&self, id: Uuid) -> Option<V> {
        let known = self.lock();
        let entry = known.map.get(&id)?;
        let fresh = self
            .max_age
            .is_none_or(|max_age| entry.read_at.elapsed() < max_age);
        fresh.then(|| entry.hash.clone())
    }

    fn insert(&self, id: Uuid, hash: V, read_at: std::time::Instant, generation: Option<u64>) {
        let mut known = self.lock();
        if generation.is_some_and(|g| g != known.generation) {
            return;
        }
        if known.map.len() >= DIGESTS {
            known.map.clear();
        }
        known.map.insert(id, Known { hash, read_at });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<V>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What the server keeps in memory about credentials that can lose their
/// power: API keys, worker tokens, and which principal owns a task (which
/// never changes, so it is only bounded). The feed's hub calls
/// [`Credentials::forget`] for every [`Change::Credential`] it hears from
/// the store, from any replica, and [`Credentials::clear`] whenever it may
/// have missed some (a gap, a new subscription): a revocation reaches
/// every replica's memory as fast as the change stream does.
///
/// [`Change::Credential`]: meatspace_store::Change::Credential
#[derive(Debug, Clone)]
pub struct Credentials {
    pub keys: DigestCache<meatspace_store::KeyRecord>,
    pub workers: DigestCache,
    pub owners: DigestCache<Uuid>,
    /// When each key was last used, written to the store about once a
    /// minute ([`KeyUse::flush`]).
    pub key_use: KeyUse,
}

impl Default for Credentials {
    fn default() -> Self {
        Credentials {
            keys: DigestCache::for_good(),
            workers: DigestCache::for_workers(),
            owners: DigestCache::for_good(),
            key_use: KeyUse::default(),
        }
    }
}

impl Credentials {
    pub fn forget(&self, id: Uuid) {
        self.keys.forget(id);
        self.workers.forget(id);
    }

    pub fn clear(&self) {
        self.keys.clear();
        self.workers.clear();
    }
}

/// Last use of each key since the previous flush.
#[derive(Debug, Clone, Default)]
pub struct KeyUse(std::sync::Arc<std::sync::Mutex<std::collections::HashMap<Uuid, DateTime<Utc>>>>);

/// Keys whose use is remembered between flushes at most; more are dropped
/// until the next flush (`last_used_at` is coarse by design).
const KEY_USES: usize = 10_000;

impl KeyUse {
    pub fn record(&self, key: Uuid, at: DateTime<Utc>) {
        let mut used = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if used.len() < KEY_USES || used.contains_key(&key) {
            used.insert(key, at);
        }
    }

    /// Writes what was recorded since the last flush.
    pub async fn flush(&self, store: &dyn meatspace_store::Store) -> Result<(), StoreError> {
        let used: Vec<(Uuid, DateTime<Utc>)> = std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_iter()
        .collect();
        if used.is_empty() {
            return Ok(());
        }
        store.touch_api_keys(&used).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the store reads a cache makes.
    async fn digest_counting(
        cache: &DigestCache,
        id: Uuid,
        stored: Option<&TokenHash>,
        reads: &std::sync::atomic::AtomicUsize,
    ) -> Option<TokenHash> {
        let read = async {
            reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(stored.cloned())
        };
        cache.digest(id, read).await.expect("no store error")
    }

    #[tokio::test]
    async fn a_digest_is_read_once_and_an_unknown_id_every_time() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (id, hash) = (Uuid::new_v4(), TokenHash::of("mst_x"));
        for cache in [DigestCache::for_workers(), DigestCache::for_agents()] {
            let reads = AtomicUsize::new(0);
            for _ in 0..3 {
                let got = digest_counting(&cache, id, Some(&hash), &reads).await;
                assert_eq!(got, Some(hash.clone()));
            }
            assert_eq!(reads.load(Ordering::SeqCst), 1);

            let (unknown, reads) = (Uuid::new_v4(), AtomicUsize::new(0));
            for _ in 0..3 {
                assert_eq!(digest_counting(&cache, unknown, None, &reads).await, None);
            }
            assert_eq!(reads.load(Ordering::SeqCst), 3, "an unknown id was cached");
        }
    }

    #[tokio::test]
    async fn an_agent_digest_older_than_its_limit_is_read_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // A limit of zero: every entry is already too old.
        let cache = DigestCache::new(Some(std::time::Duration::ZERO));
        let (id, hash) = (Uuid::new_v4(), TokenHash::of("mst_x"));
        let reads = AtomicUsize::new(0);
        for _ in 0..3 {
            digest_counting(&cache, id, Some(&hash), &reads).await;
        }
        assert_eq!(reads.load(Ordering::SeqCst), 3);
        // The tombstone is forgotten: the store no longer knows the token.
        assert_eq!(digest_counting(&cache, id, None, &reads).await, None);
    }
}
