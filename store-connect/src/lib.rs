//! Opens the store a database URL names, by its scheme. A crate of its own
//! because it must know both backends, and each backend crate depends on
//! `meatspace-store` (for the trait and the engine), which therefore cannot
//! depend on them. The binaries and the test suites call [`connect`]; nothing
//! else needs to name a backend.

use std::sync::Arc;

use meatspace_domain::Policy;
use meatspace_store::{ConnectOptions, Store, StoreError, redact_url};

pub use meatspace_store_postgres::PgStore;
pub use meatspace_store_sqlite::SqliteStore;

/// Opens the store named by `url` (`postgres://…`, `postgresql://…` or
/// `sqlite://…`) and runs its migrations.
pub async fn connect(
    url: &str,
    policy: Policy,
    options: &ConnectOptions,
) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::connect(url, policy, options).await?))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::connect(url, policy, options).await?))
    } else {
        Err(StoreError::UnsupportedUrl(redact_url(url)))
    }
}
