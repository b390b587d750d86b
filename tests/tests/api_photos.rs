//! Photo uploads cannot take the server down or fill its database: the
//! pixels are bounded in all (read from the header, before decoding), the
//! decodes in flight share a memory budget, and a task holds a bounded
//! number of photo bytes. Each was once an attack: a zero-filled
//! 8192 × 8192 PNG of 261 KB took 260 MB to decode, four RGBA16 ones 4 GB.

use meatspace_api::photo::{DecodeMemory, PhotoLimits};
use meatspace_tests::Db;
use meatspace_tests::server::{Expect, TestServer, images, str_at};
use reqwest::StatusCode;
use uuid::Uuid;

meatspace_tests::api_tests!(
    a_photo_with_too_many_pixels_is_refused_from_its_header,
    a_photo_needing_more_than_the_decode_memory_is_refused,
    a_task_holds_at_most_its_photo_bytes,
);

const MIB: u64 = 1024 * 1024;

async fn server_with(db: Db, limits: PhotoLimits) -> TestServer {
    TestServer::start_configured(db, |o| o.photo_limits = limits).await
}

async fn photo_events(srv: &TestServer, id: Uuid, token: &str) -> usize {
    srv.feed(id, token)
        .await
        .iter()
        .filter(|e| e["type"] == "worker.photo")
        .count()
}

/// 8192 × 8192 passes the per-side limit: the total (67 MP) is over the
/// default 40 MP, which the header alone tells. The file's data is that of
/// one pixel, so a server that started decoding would call it broken
/// instead.
async fn a_photo_with_too_many_pixels_is_refused_from_its_header(db: Db) {
    let srv = TestServer::start(db).await;
    let t = srv.active_task("Photograph the mural").await;
    let body = srv
        .worker(&t.worker_token)
        .send_png(t.task_id, images::png_header_only(8192, 8192))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    assert!(
        str_at(&body, "/detail").contains("40000000 pixels in all"),
        "{body}"
    );
    assert_eq!(photo_events(&srv, t.task_id, &t.agent_token).await, 0);
    // Capabilities state the bound.
    let caps = srv.capabilities().await;
    assert_eq!(caps["limits"]["photo_max_pixels"], 40_000_000);
}

/// A small file whose pixels need more memory than all decodes together
/// may hold is refused (413) before a pixel is decoded; one that fits is
/// accepted, and comes back 8-bit.
async fn a_photo_needing_more_than_the_decode_memory_is_refused(db: Db) {
    let srv = server_with(
        db,
        PhotoLimits {
            decode_memory: DecodeMemory::new(16 * MIB),
            ..PhotoLimits::new(MIB as usize, 8192)
        },
    )
    .await;
    let t = srv.active_task("Photograph the wall").await;
    let worker = srv.worker(&t.worker_token);
    // 2000 × 2000 RGBA16: 32 MB of pixels in a file of a few kilobytes.
    let heavy = images::zero_png(2000, 2000, true);
    assert!(heavy.len() < 100_000, "{} bytes", heavy.len());
    let body = worker
        .send_png(t.task_id, heavy)
        .expect_problem(StatusCode::PAYLOAD_TOO_LARGE)
        .await;
    assert!(str_at(&body, "/detail").contains("16 MiB"), "{body}");
    assert_eq!(photo_events(&srv, t.task_id, &t.agent_token).await, 0);
    let light = worker
        .send_png(t.task_id, images::zero_png(300, 200, true))
        .expect_json(StatusCode::OK)
        .await;
    let event = light["events"][0].clone();
    assert_eq!(event["type"], "worker.photo", "{light}");
    assert_eq!(photo_events(&srv, t.task_id, &t.agent_token).await, 1);
}

/// A worker could store photos without bound (each up to the upload
/// limit); a task now holds at most `max_task_bytes` of them, and the
/// upload past it is refused with a documented problem, writing nothing.
async fn a_task_holds_at_most_its_photo_bytes(db: Db) {
    let cap = 40_000;
    let srv = server_with(
        db,
        PhotoLimits {
            max_task_bytes: cap,
            ..PhotoLimits::new(MIB as usize, 8192)
        },
    )
    .await;
    let caps = srv.capabilities().await;
    assert_eq!(caps["limits"]["photo_bytes_per_task"], cap);
    let t = srv.active_task("Photograph every room").await;
    let worker = srv.worker(&t.worker_token);
    // Noise does not compress: about 12 KB stored each.
    let upload = || worker.send_png(t.task_id, images::noisy_png(64, 64));
    let mut accepted = 0;
    let refused = loop {
        let res = upload().send().await.unwrap();
        if res.status() != StatusCode::OK {
            break res;
        }
        accepted += 1;
        assert!(accepted <= 10, "40 KB held more than ten 12 KB photos");
    };
    assert!(accepted >= 2, "only {accepted} photos fit in {cap} bytes");
    assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert!(
        str_at(&body, "/type").ends_with("/photo-quota-exceeded"),
        "{body}"
    );
    let stored = srv.store.photo_bytes(t.task_id).await.unwrap();
    assert!(
        stored <= cap,
        "{stored} bytes stored, over the cap of {cap}"
    );
    assert_eq!(
        photo_events(&srv, t.task_id, &t.agent_token).await,
        accepted
    );
    // Refused again: nothing is written past the cap.
    upload().expect_problem(StatusCode::PAYLOAD_TOO_LARGE).await;
    assert_eq!(srv.store.photo_bytes(t.task_id).await.unwrap(), stored);
}
