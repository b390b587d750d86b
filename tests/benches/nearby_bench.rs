//! Nearby-listing benchmark on both backends (not a pass/fail test: a
//! `harness = false` bench target, run by hand with a PostgreSQL server as
//! `scripts/test` starts one):
//!
//! ```text
//! D=$(mktemp -d); scripts/postgres.sh start $D >/dev/null; source $D/env
//! cargo bench -p meatspace-tests --bench nearby_bench
//! scripts/postgres.sh stop $D
//! ```
//!
//! For each backend and size (1,000 and 1,000,000 stored tasks, a tenth of
//! them open, all with a place spread evenly over an area the size of
//! Germany, 47–55° N by 6–15° E), loads the tasks straight into the
//! database, then asks the store for the first page of open tasks near 300
//! points of the area (50 a page, as the API does), within 50 km (the API's
//! default distance) and within 1,000 km (its largest: the small size then
//! fills the page too), and prints the latency percentiles, the CPU time
//! per query of this process (the store's own work: the cover, the
//! decoding, the distances; on SQLite also the database's) and the ratio of
//! the medians. `MEATSPACE_BENCH_SIZES` overrides the sizes
//! (comma-separated), `MEATSPACE_BENCH_DBS` (`sqlite` or `postgres`) runs
//! one backend.

use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use meatspace_domain::Policy;
use meatspace_domain::place::cell_of;
use meatspace_store::{Near, Store};
use meatspace_tests::{Db, TestDb, cpu_time};
use uuid::Uuid;

const QUERIES: usize = 300;
const PAGE: u32 = 51;
/// The two questions asked: the API's default distance, within which the
/// small size has about one open task per point, and the API's largest,
/// within which both sizes fill the page.
const WITHIN_M: [f64; 2] = [50_000.0, 1_000_000.0];
const AREA: ((f64, f64), (f64, f64)) = ((47.0, 55.0), (6.0, 15.0));

/// A deterministic stream of numbers in [0, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    fn point(&mut self) -> (f64, f64) {
        let ((lat0, lat1), (lon0, lon1)) = AREA;
        (
            lat0 + self.next() * (lat1 - lat0),
            lon0 + self.next() * (lon1 - lon0),
        )
    }
}

/// `n` tasks, every tenth open, the others completed, all with a place.
async fn load(db: Db, url: &str, n: usize) {
    let mut rng = Lcg(n as u64);
    let owner = meatspace_domain::identity::DEVELOPMENT_PRINCIPAL;
    let now = Utc::now();
    let chunk = 5_000;
    let mut i = 0;
    match db {
        Db::Postgres => {
            let pool = sqlx::PgPool::connect(url).await.expect("connect");
            while i < n {
                let m = chunk.min(n - i);
                let (mut ids, mut states, mut lats, mut lons, mut cells) =
                    (vec![], vec![], vec![], vec![], vec![]);
                for k in i..i + m {
                    let (lat, lon) = rng.point();
                    ids.push(Uuid::new_v4());
                    states.push(if k % 10 == 0 { "open" } else { "completed" });
                    lats.push(lat);
                    lons.push(lon);
                    cells.push(cell_of(lat, lon));
                }
                sqlx::query(
                    "INSERT INTO tasks (id, description, state, agent_token_hash, created_at, \
                     updated_at, expires_at, owner_id, latitude, longitude, radius_m, presence, \
                     cell, ended_at) \
                     SELECT id, 'bench', state, sha256('t'), $2, $2, $3, $4, lat, lon, 100, \
                       'none', cell, CASE WHEN state = 'open' THEN NULL ELSE $2 END \
                     FROM UNNEST($1::uuid[], $5::text[], $6::float8[], $7::float8[], \
                       $8::bigint[]) AS r(id, state, lat, lon, cell)",
                )
                .bind(&ids)
                .bind(now)
                .bind(now + TimeDelta::days(30))
                .bind(owner)
                .bind(&states)
                .bind(&lats)
                .bind(&lons)
                .bind(&cells)
                .execute(&pool)
                .await
                .expect("load");
                i += m;
            }
            sqlx::query("VACUUM ANALYZE tasks")
                .execute(&pool)
                .await
                .expect("analyze");
        }
        Db::Sqlite => {
            let pool = sqlx::SqlitePool::connect(url).await.expect("connect");
            let (created, expires) = (
                now.timestamp_millis(),
                (now + TimeDelta::days(30)).timestamp_millis(),
            );
            while i < n {
                let m = chunk.min(n - i);
                let mut tx = pool.begin().await.expect("begin");
                for k in i..i + m {
                    let (lat, lon) = rng.point();
                    let open = k % 10 == 0;
                    sqlx::query(
                        "INSERT INTO tasks (id, description, state, agent_token_hash, \
                         created_at, updated_at, expires_at, owner_id, latitude, longitude, \
                         radius_m, presence, cell, ended_at) \
                         VALUES ($1, 'bench', $2, x'00', $3, $3, $4, $5, $6, $7, 100, 'none', \
                         $8, $9)",
                    )
                    .bind(Uuid::new_v4().to_string())
                    .bind(if open { "open" } else { "completed" })
                    .bind(created)
                    .bind(expires)
                    .bind(owner.to_string())
                    .bind(lat)
                    .bind(lon)
                    .bind(cell_of(lat, lon))
                    .bind((!open).then_some(created))
                    .execute(&mut *tx)
                    .await
                    .expect("load");
                }
                tx.commit().await.expect("commit");
                i += m;
            }
            sqlx::query("ANALYZE")
                .execute(&pool)
                .await
                .expect("analyze");
        }
    }
}

struct Figures {
    p50: Duration,
    p90: Duration,
    p99: Duration,
    cpu: Duration,
    listed: f64,
}

async fn measure(store: &dyn Store, within_m: f64) -> Figures {
    let mut rng = Lcg(42);
    // Warm the caches and the pool.
    for _ in 0..20 {
        let (latitude, longitude) = rng.point();
        let near = Near {
            latitude,
            longitude,
            within_m,
        };
        store
            .open_tasks_near(near, None, PAGE)
            .await
            .expect("query");
    }
    let mut rng = Lcg(7);
    let mut times = Vec::with_capacity(QUERIES);
    let mut listed = 0usize;
    let cpu = cpu_time();
    for _ in 0..QUERIES {
        let (latitude, longitude) = rng.point();
        let near = Near {
            latitude,
            longitude,
            within_m,
        };
        let started = Instant::now();
        let page = store
            .open_tasks_near(near, None, PAGE)
            .await
            .expect("query");
        times.push(started.elapsed());
        listed += page.len();
    }
    let cpu = cpu_time() - cpu;
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    Figures {
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        cpu: cpu / QUERIES as u32,
        listed: listed as f64 / QUERIES as f64,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes: Vec<usize> = std::env::var("MEATSPACE_BENCH_SIZES")
        .ok()
        .map(|s| {
            s.split(',')
                .map(|n| n.trim().parse().expect("a size"))
                .collect()
        })
        .unwrap_or_else(|| vec![1_000, 1_000_000]);
    let backends: Vec<Db> = match std::env::var("MEATSPACE_BENCH_DBS").as_deref() {
        Ok("sqlite") => vec![Db::Sqlite],
        Ok("postgres") => vec![Db::Postgres],
        _ => vec![Db::Sqlite, Db::Postgres],
    };
    println!(
        "nearby: first page ({} max) of {QUERIES} points, {}-{} ° N by {}-{} ° E",
        PAGE - 1,
        AREA.0.0,
        AREA.0.1,
        AREA.1.0,
        AREA.1.1,
    );
    for db in backends {
        let mut medians = vec![Vec::new(); WITHIN_M.len()];
        for &n in &sizes {
            let test_db = TestDb::new(db).await;
            // Migrations first, through the store.
            let store = test_db.store(Policy::default()).await;
            let started = Instant::now();
            load(db, &test_db.url, n).await;
            let loaded = started.elapsed();
            println!(
                "{db:?} {n:>9} tasks ({:>7} open; loaded in {loaded:.0?})",
                n / 10
            );
            for (i, &within_m) in WITHIN_M.iter().enumerate() {
                let f = measure(store.as_ref(), within_m).await;
                println!(
                    "  within {:>4} km: p50 {:.2?}  p90 {:.2?}  p99 {:.2?}  CPU/query {:.2?}  \
                     tasks listed/query {:.1}",
                    within_m / 1000.0,
                    f.p50,
                    f.p90,
                    f.p99,
                    f.cpu,
                    f.listed
                );
                medians[i].push((n, f.p50));
            }
        }
        for (within_m, medians) in WITHIN_M.iter().zip(&medians) {
            if let [(small, a), .., (large, b)] = medians[..] {
                println!(
                    "{db:?}, within {} km: p50 at {large} / p50 at {small} = {:.2}",
                    within_m / 1000.0,
                    b.as_secs_f64() / a.as_secs_f64()
                );
            }
        }
    }
}
