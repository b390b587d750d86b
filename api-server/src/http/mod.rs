//! The HTTP layer every route shares: the problem+json errors
//! ([`error`]), extractors that answer bad input with them ([`extract`]),
//! and the middleware a request passes through — the database guard
//! ([`availability`]), `Idempotency-Key` ([`idempotency`]), per-credential
//! limits ([`rate_limit`]), metrics ([`metrics`]) and the request span
//! ([`telemetry`]) — and the accept loop ([`serve`]) with the connections
//! it drives ([`connection`], [`protocol`]).

pub mod availability;
pub mod connection;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod metrics;
pub mod protocol;
pub mod rate_limit;
pub mod serve;
pub mod telemetry;
