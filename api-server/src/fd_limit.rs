//! Fitting the connection cap to the process's file-descriptor limit.
//!
//! Each client connection is a descriptor, and so are the database
//! connections, the listener and the files the server opens. A server that
//! runs out of descriptors fails in ugly ways: `accept` errors in a loop,
//! a database reconnect fails, a photo cannot be read. So at start-up the
//! server raises its soft `RLIMIT_NOFILE` to the hard limit (as Go's runtime
//! does), and if that is still too small for the configured connection cap
//! plus a reserve, it lowers the cap and says so: past the cap, new clients
//! wait to be accepted instead of breaking the server.

/// Descriptors kept free for everything that is not a client connection:
/// database connections (pool, probe, listener), log and data files, photos
/// being read, and the standard streams.
pub const RESERVED: u64 = 256;

/// The connection cap that fits a limit of `nofile` descriptors. Pure.
pub fn fit(max_connections: u64, nofile: u64, db_connections: u64) -> u64 {
    let reserve = RESERVED + db_connections;
    max_connections.min(nofile.saturating_sub(reserve)).max(1)
}

/// Raises the soft descriptor limit as far as the hard limit allows and
/// returns the connection cap that fits it (`max_connections` when it does).
pub fn raise_and_fit(max_connections: u64, db_connections: u64) -> u64 {
    let nofile = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read or raise the open-file limit; keeping the connection cap");
            return max_connections;
        }
    };
    let cap = fit(max_connections, nofile, db_connections);
    if cap < max_connections {
        tracing::warn!(
            open_file_limit = nofile,
            configured = max_connections,
            cap,
            "the open-file limit is too low for MEATSPACE_MAX_CONNECTIONS; \
             accepting at most {cap} connections at once (raise `ulimit -n` for more)"
        );
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn the_cap_leaves_room_for_the_database_and_files() {
        // Plenty of descriptors: the configured cap stands.
        assert_eq!(fit(20_000, 1_048_576, 16), 20_000);
        // A typical soft limit of 1024: connections get what is left.
        assert_eq!(fit(20_000, 1024, 16), 1024 - 256 - 16);
        // Never zero, even when the limit is absurdly low.
        assert_eq!(fit(20_000, 100, 16), 1);
    }
}
