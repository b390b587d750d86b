//! Migrations never change once shipped: a database migrated by an earlier
//! build records each migration's checksum, and sqlx refuses to start a
//! build whose file differs. Each backend keeps the checksums it shipped in
//! `shipped-migrations.txt` and checks its embedded migrations against them.

use sqlx::migrate::Migrator;

/// The migrations of `migrator` whose checksum differs from the one
/// `shipped` lists (lines `version sha384-hex`, `#` comments), or that
/// went missing: empty when every shipped migration is as it shipped.
/// Migrations not listed yet are new, and fine.
pub fn changed_since_shipped(migrator: &Migrator, shipped: &str) -> Vec<String> {
    let embedded: Vec<(i64, String)> = migrator
        .iter()
        .map(|m| {
            let hex: String = m.checksum.iter().map(|b| format!("{b:02x}")).collect();
            (m.version, hex)
        })
        .collect();
    let mut changed = Vec::new();
    for line in shipped.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((version, checksum)) = line.split_once(' ') else {
            changed.push(format!("unreadable line {line:?}"));
            continue;
        };
        let Ok(version) = version.parse::<i64>() else {
            changed.push(format!("unreadable version {version:?}"));
            continue;
        };
        match embedded.iter().find(|(v, _)| *v == version) {
            Some((_, c)) if c == checksum.trim() => {}
            Some(_) => changed.push(format!("migration {version} changed")),
            None => changed.push(format!("migration {version} went missing")),
        }
    }
    changed
}

/// Panics, naming each, when a migration of `migrator` changed since it
/// shipped or went missing (see [`changed_since_shipped`]): a database it
/// ran on would not start.
pub fn assert_unchanged(migrator: &Migrator, shipped: &str) {
    let changed = changed_since_shipped(migrator, shipped);
    assert!(
        changed.is_empty(),
        "{changed:?}: a database these ran on will not start"
    );
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use sqlx::migrate::{Migration, MigrationType};

    use super::*;

    fn migrator() -> Migrator {
        let m = |v, sql: &'static str| {
            Migration::new(v, "m".into(), MigrationType::Simple, sql.into(), false)
        };
        Migrator {
            migrations: Cow::Owned(vec![m(1, "CREATE TABLE a (x int)"), m(2, "SELECT 1")]),
            ..Migrator::DEFAULT
        }
    }

    fn hex(sql: &str) -> String {
        use sha2::Digest as _;
        sha2::Sha384::digest(sql.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn a_shipped_migration_as_it_shipped_passes_and_a_new_one_is_fine() {
        let shipped = format!("# shipped\n\n0001 {}\n", hex("CREATE TABLE a (x int)"));
        assert!(changed_since_shipped(&migrator(), &shipped).is_empty());
    }

    #[test]
    fn a_changed_missing_or_unreadable_entry_is_reported() {
        let shipped = format!(
            "0001 {}\n0003 {}\nnonsense\n",
            hex("CREATE TABLE a (x bigint)"),
            hex("SELECT 3")
        );
        assert_eq!(
            changed_since_shipped(&migrator(), &shipped),
            [
                "migration 1 changed",
                "migration 3 went missing",
                "unreadable line \"nonsense\""
            ]
        );
    }
}
