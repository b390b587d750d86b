//! Where a task is done, through the real server on both backends: a task's
//! place and its refusals, the workers' nearest-first list across pages
//! (at the antimeridian and near a pole too), and the positions a worker
//! sends when starting and with photos, recorded with their distance as
//! untrusted data, flagged or refused as the agent asked.

use meatspace_domain::place::distance_m;
use meatspace_tests::Db;
use meatspace_tests::server::{Expect, TestServer, images, str_at, task_and_token, uuid_at};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

meatspace_tests::api_tests!(
    a_task_has_a_place_and_bad_places_are_refused,
    open_tasks_come_nearest_first_across_pages,
    nearby_lists_cross_the_antimeridian_and_the_pole,
    positions_are_recorded_flagged_or_required,
);

/// Creates and publishes a task with this body; returns its id and token.
async fn open_task(srv: &TestServer, body: Value) -> (Uuid, String) {
    let created = srv.create_task_with(body).await;
    let (id, token) = task_and_token(&created);
    srv.publish(id, &token).await;
    (id, token)
}

fn at(description: &str, latitude: f64, longitude: f64) -> Value {
    json!({
        "description": description,
        "location": { "latitude": latitude, "longitude": longitude },
    })
}

async fn a_task_has_a_place_and_bad_places_are_refused(db: Db) {
    let srv = TestServer::start(db).await;
    let created = srv
        .create_task_with(json!({
            "description": "Check the notice board",
            "location": {
                "latitude": 52.52, "longitude": 13.405, "radius_m": 50,
                "address": "Alexanderplatz 1, Berlin",
            },
            "presence": "flag",
        }))
        .await;
    let (id, token) = task_and_token(&created);
    let task = srv.task(id, &token).await;
    assert_eq!(
        task["location"],
        json!({"latitude": 52.52, "longitude": 13.405, "radius_m": 50,
               "address": "Alexanderplatz 1, Berlin"})
    );
    assert_eq!(task["presence"], "flag");
    // The default radius; and a task without a place has neither field.
    let (id, token) = open_task(&srv, at("Anywhere near", 48.85, 2.35)).await;
    assert_eq!(srv.task(id, &token).await["location"]["radius_m"], 100);
    let (id, token) = srv.create_task("Anywhere at all").await;
    let plain = srv.task(id, &token).await;
    assert!(plain.get("location").is_none() && plain.get("presence").is_none());

    let before = srv.counts().await;
    for (body, says) in [
        (at("x", 90.5, 0.0), "latitude"),
        (at("x", 0.0, -181.0), "longitude"),
        (
            json!({"description": "x", "location": {"latitude": 1, "longitude": 1, "radius_m": 0}}),
            "radius_m",
        ),
        (
            json!({"description": "x", "location": {"latitude": 1, "longitude": 1, "radius_m": 50001}}),
            "radius_m",
        ),
        (
            json!({"description": "x", "location": {"latitude": 1, "longitude": 1, "address": " "}}),
            "address",
        ),
        (
            json!({"description": "x", "presence": "require"}),
            "presence",
        ),
        (
            json!({"description": "x", "location": {"latitude": 1, "longitude": 1, "x": 1}}),
            "unknown field",
        ),
        (
            json!({"description": "x", "location": {"latitude": "north", "longitude": 1}}),
            "latitude",
        ),
    ] {
        let problem = srv
            .dev(Method::POST, "/api/v1/tasks")
            .json(&body)
            .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
            .await;
        assert!(
            str_at(&problem, "/detail").contains(says),
            "{body}: {problem}"
        );
    }
    assert_eq!(
        srv.counts().await.tasks,
        before.tasks,
        "nothing was written"
    );

    // The capabilities document states the model and its bounds, and that
    // a position is evidence, not proof.
    let caps = srv.capabilities().await;
    let place = &caps["task_location"];
    assert_eq!(place["default_radius_m"], 100);
    assert_eq!(place["max_radius_m"], 50_000);
    assert!(str_at(place, "/evidence_not_proof").contains("evidence, not proof"));
    assert!(caps["endpoints"]["create_task"]["body"]["location"].is_string());
}

/// Metres north of (lat, lon) as a latitude: about 111.2 km a degree.
fn north(lat: f64, metres: f64) -> f64 {
    lat + metres / 111_200.0
}

/// Every page of the nearby list: the tasks in order with their distances.
async fn nearby(
    srv: &TestServer,
    token: &str,
    near: &str,
    query: &str,
) -> Vec<(Uuid, Option<f64>)> {
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/api/v1/worker/tasks?near={near}&{query}");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = srv.worker(token).get_json(&path).await;
        for t in page["tasks"].as_array().expect("tasks") {
            listed.push((uuid_at(t, "/id"), t["distance_m"].as_f64()));
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return listed,
        }
    }
}

async fn open_tasks_come_nearest_first_across_pages(db: Db) {
    let srv = TestServer::start(db).await;
    let (lat, lon) = (-33.8688, 151.2093);
    // Created in an order unrelated to their distance; two at one spot.
    let metres = [900.0, 150.0, 4_000.0, 150.0, 12_000.0, 40.0, 2_500.0];
    let mut located = Vec::new();
    for (i, m) in metres.iter().enumerate() {
        let (id, _) = open_task(&srv, at(&format!("located {i}"), north(lat, *m), lon)).await;
        located.push((id, *m));
    }
    let (far, _) = open_task(&srv, at("too far", north(lat, 30_000.0), lon)).await;
    let (anywhere_a, _) = srv.create_open_task("anywhere a").await;
    let (anywhere_b, _) = srv.create_open_task("anywhere b").await;
    // A draft with a place is no open task.
    let draft = srv.create_task_with(at("draft", lat, lon)).await;
    let draft = uuid_at(&draft, "/task/id");
    let (_, worker) = srv.register_worker("Ada").await;

    let near = format!("{lat},{lon}");
    for limit in [1, 3, 4, 50] {
        let listed = nearby(
            &srv,
            &worker,
            &near,
            &format!("within_m=20000&limit={limit}"),
        )
        .await;
        let mut expected = located.clone();
        expected.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let ids: Vec<Uuid> = listed.iter().map(|(id, _)| *id).collect();
        let mut want: Vec<Uuid> = expected.iter().map(|(id, _)| *id).collect();
        want.extend([anywhere_a, anywhere_b]);
        assert_eq!(
            ids, want,
            "limit {limit}: nearest first, then those without a place"
        );
        for ((_, distance), (_, metres)) in listed.iter().zip(&expected) {
            let distance = distance.expect("a located task has its distance");
            assert!(
                (distance - metres).abs() < metres * 0.01 + 1.0,
                "{distance} vs {metres}"
            );
        }
        assert!(listed[located.len()..].iter().all(|(_, d)| d.is_none()));
        assert!(!ids.contains(&far) && !ids.contains(&draft));
    }
    // The distance the list gives is the geodesic one.
    let listed = nearby(&srv, &worker, &near, "within_m=100").await;
    let nearest = listed[0].1.expect("distance");
    let exact = distance_m(lat, lon, north(lat, 40.0), lon);
    assert!((nearest - exact).abs() <= 0.05, "{nearest} vs {exact}");
    // Bad points and bounds.
    for query in ["near=north", "near=1", "near=1,2&cursor=zzz"] {
        srv.worker(&worker)
            .get(&format!("/api/v1/worker/tasks?{query}"))
            .expect_problem(StatusCode::BAD_REQUEST)
            .await;
    }
    for query in [
        "near=91,0",
        "near=0,0&within_m=0",
        "near=0,0&within_m=1000001",
        "within_m=5",
    ] {
        srv.worker(&worker)
            .get(&format!("/api/v1/worker/tasks?{query}"))
            .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
            .await;
    }
}

/// The ids of the listed tasks that have a distance (a place), in order.
fn located(listed: &[(Uuid, Option<f64>)]) -> Vec<Uuid> {
    listed
        .iter()
        .filter(|(_, d)| d.is_some())
        .map(|(id, _)| *id)
        .collect()
}

async fn nearby_lists_cross_the_antimeridian_and_the_pole(db: Db) {
    let srv = TestServer::start(db).await;
    // Fiji: two tasks on either side of the antimeridian.
    let (east, _) = open_task(&srv, at("east", -17.0, 179.9995)).await;
    let (west, _) = open_task(&srv, at("west", -17.0, -179.997)).await;
    let (inland, _) = open_task(&srv, at("inland", -17.0, 179.9)).await;
    // Near the north pole, on opposite meridians.
    let (pole_a, _) = open_task(&srv, at("pole a", 89.9995, 0.0)).await;
    let (pole_b, _) = open_task(&srv, at("pole b", 89.9995, 180.0)).await;
    let (pole_c, _) = open_task(&srv, at("pole c", 89.99, 90.0)).await;
    let (_, worker) = srv.register_worker("Ada").await;

    let ids = located(&nearby(&srv, &worker, "-17.0,-179.9995", "within_m=2000").await);
    assert_eq!(
        ids,
        [east, west],
        "both sides of the antimeridian, nearest first"
    );
    let ids = located(&nearby(&srv, &worker, "-17.0,179.94", "within_m=20000").await);
    assert_eq!(ids, [inland, east, west]);

    let over_the_pole = nearby(&srv, &worker, "89.9995,90.0", "within_m=5000&limit=1").await;
    let ids = located(&over_the_pole);
    let (mut pair, mut first_two) = ([pole_a, pole_b], [ids[0], ids[1]]);
    pair.sort();
    first_two.sort();
    assert_eq!(
        first_two, pair,
        "the two 79 m away across the pole come first"
    );
    assert_eq!(ids[2], pole_c);
    assert_eq!(ids.len(), 3);
}

/// A position `metres` north of the place (52.52, 13.405).
fn position(metres: f64, accuracy_m: f64) -> Value {
    json!({ "latitude": north(52.52, metres), "longitude": 13.405, "accuracy_m": accuracy_m })
}

async fn claimed(srv: &TestServer, presence: &str) -> (Uuid, String, String) {
    let (id, token) = open_task(
        srv,
        json!({
            "description": format!("presence {presence}"),
            "location": { "latitude": 52.52, "longitude": 13.405, "radius_m": 100 },
            "presence": presence,
        }),
    )
    .await;
    let (_, worker) = srv.register_worker("Ada").await;
    srv.worker_post(id, &worker, "claim").await;
    (id, token, worker)
}

async fn send_photo(
    srv: &TestServer,
    worker: &str,
    id: Uuid,
    at: Option<Value>,
) -> reqwest::Response {
    let mut path = format!("/api/v1/worker/tasks/{id}/photos");
    if let Some(p) = at {
        path.push_str(&format!(
            "?latitude={}&longitude={}&accuracy_m={}",
            p["latitude"], p["longitude"], p["accuracy_m"]
        ));
    }
    srv.worker(worker)
        .post(&path)
        .header("content-type", "image/png")
        .body(images::png(8, 8))
        .send()
        .await
        .expect("send the photo")
}

async fn positions_are_recorded_flagged_or_required(db: Db) {
    let srv = TestServer::start(db).await;

    // flag: a start 400 m away with 50 m accuracy is off site, recorded.
    let (id, token, worker) = claimed(&srv, "flag").await;
    let started = srv
        .worker(&worker)
        .post_json(
            &format!("/api/v1/worker/tasks/{id}/start"),
            &json!({ "position": position(400.0, 50.0) }),
        )
        .await;
    let event = &started["events"][0];
    assert_eq!(event["type"], "task.started");
    assert_eq!(event["untrusted"], true, "a position is worker-sent data");
    let seen = &event["data"]["position"];
    assert!(
        (seen["distance_m"].as_f64().unwrap() - 400.0).abs() < 5.0,
        "{seen}"
    );
    assert_eq!(seen["off_site"], true);
    assert_eq!(seen["accuracy_m"], 50.0);
    assert!(seen["recorded_at"].is_string(), "the server's own time");
    // A photo 120 m away with 30 m accuracy is on site: 120 < 100 + 30.
    let res = send_photo(&srv, &worker, id, Some(position(120.0, 30.0))).await;
    assert_eq!(res.status(), StatusCode::OK);
    let feed = srv.feed(id, &token).await;
    let photo = feed
        .iter()
        .find(|e| e["type"] == "worker.photo")
        .expect("photo event");
    assert_eq!(photo["data"]["position"]["off_site"], false);
    assert_eq!(photo["untrusted"], true);
    // Half a position is refused.
    let res = srv
        .worker(&worker)
        .post(&format!("/api/v1/worker/tasks/{id}/photos?latitude=52.52"))
        .header("content-type", "image/png")
        .body(images::png(8, 8))
        .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
        .await;
    assert!(str_at(&res, "/detail").contains("together"), "{res}");

    // require: no position, or one too far, is refused and writes nothing.
    let (id, token, worker) = claimed(&srv, "require").await;
    let start = format!("/api/v1/worker/tasks/{id}/start");
    srv.worker(&worker)
        .post(&start)
        .expect_problem_type(StatusCode::UNPROCESSABLE_ENTITY, "position-required")
        .await;
    let problem = srv
        .worker(&worker)
        .post(&start)
        .json(&json!({ "position": position(1_000.0, 20.0) }))
        .expect_problem_type(StatusCode::UNPROCESSABLE_ENTITY, "off-site")
        .await;
    let detail = str_at(&problem, "/detail");
    assert!(detail.contains("120 m"), "the distance allowed: {detail}");
    let metres: u64 = detail
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .expect("the distance in the detail");
    assert!((995..=1005).contains(&metres), "{detail}");
    assert_eq!(srv.task(id, &token).await["state"], "assigned");
    // The accuracy counts: 1000 m away but only known to 950 m.
    srv.worker(&worker)
        .post_json(&start, &json!({ "position": position(1_000.0, 950.0) }))
        .await;
    // Photos: far refused, near accepted with its distance.
    let res = send_photo(&srv, &worker, id, Some(position(2_000.0, 10.0))).await;
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let res = send_photo(&srv, &worker, id, None).await;
    assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let res = send_photo(&srv, &worker, id, Some(position(60.0, 10.0))).await;
    assert_eq!(res.status(), StatusCode::OK);
    let feed = srv.feed(id, &token).await;
    let photos: Vec<_> = feed
        .iter()
        .filter(|e| e["type"] == "worker.photo")
        .collect();
    assert_eq!(photos.len(), 1, "only the photo on site was stored");
    let d = photos[0]["data"]["position"]["distance_m"]
        .as_f64()
        .unwrap();
    assert!((d - 60.0).abs() < 1.0, "{d}");

    // Without a place a position is recorded as sent, with no distance.
    let t = srv.active_task("anywhere").await;
    let res = send_photo(&srv, &t.worker_token, t.task_id, Some(position(0.0, 5.0))).await;
    assert_eq!(res.status(), StatusCode::OK);
    let feed = srv.feed(t.task_id, &t.agent_token).await;
    let photo = feed
        .iter()
        .find(|e| e["type"] == "worker.photo")
        .expect("photo");
    assert!(photo["data"]["position"]["latitude"].is_number());
    assert!(photo["data"]["position"].get("distance_m").is_none());
}
