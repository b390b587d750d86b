//! The worker web app in a real headless Chromium against the real server:
//! an invited person does a whole task from a phone-sized browser while the
//! agent follows the API feed; two browsers race to claim; agent text is
//! shown as text; forms without their CSRF token are refused; a phone whose
//! position is emulated (DevTools geolocation override) finds tasks near it
//! and works on site; each page is screenshot at 360 px and checked for
//! sideways scrolling.

use std::time::Duration;

use meatspace_tests::Db;
use meatspace_tests::browser::{Browser, Chromedriver, screenshot_dir};
use meatspace_tests::server::{Expect, FULL_STORY, TestServer, images, str_at, types};
use reqwest::StatusCode;
use reqwest::header::COOKIE;
use serde_json::{Value, json};
use uuid::Uuid;

/// A screenshot named `name`, when this run takes them (`shots`).
async fn screenshot_if(browser: &Browser, shots: bool, name: &str) {
    if shots {
        browser.screenshot(name).await;
    }
}

/// Creates a one-time invite link as the operator.
async fn invite(server: &TestServer) -> String {
    let body = server
        .dev(reqwest::Method::POST, "/api/v1/workers/invites")
        .json(&json!({ "expires_in_seconds": 600 }))
        .expect_json(StatusCode::CREATED)
        .await;
    let url = str_at(&body, "/invite_url");
    assert!(url.starts_with(&server.base_url), "{url}");
    url
}

/// Signs a new person in through an invite link.
async fn join(browser: &Browser, url: &str, name: &str) {
    browser.goto(url).await;
    browser.fill("#name", name).await;
    browser.click("button[type=submit]").await;
    browser.wait_for_text("h1", "Open tasks").await;
}

/// Signs in by exchanging a worker token for a session.
async fn sign_in_with_token(browser: &Browser, token: &str) {
    browser.goto("/app/login").await;
    browser.fill("#token", token).await;
    browser.click("button.primary").await;
    browser.wait_for_text("h1", "Open tasks").await;
}

/// The agent's view of the feed, as event types.
async fn agent_types(server: &TestServer, task: Uuid, token: &str) -> Vec<String> {
    types(&server.feed(task, token).await)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// Waits until the agent's feed has `n` events (the page answered already,
/// so this is only the database catching up with nothing: a bounded poll).
async fn agent_feed_len(server: &TestServer, task: Uuid, token: &str, n: usize) -> Vec<Value> {
    let what = format!("the agent's feed has {n} events");
    meatspace_tests::eventually(Duration::from_secs(30), &what, || async {
        let events = server.feed(task, token).await;
        (events.len() >= n).then_some(events)
    })
    .await
}

async fn end_to_end(db: Db) {
    let server = TestServer::start(db).await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser(&server.base_url).await;
    let shots = db == Db::Sqlite;
    let description = "Photograph the notice board at the town hall.\nIt is left of the door.";
    let (task, agent) = server.create_open_task(description).await;

    // Getting in: the invite link, a display name, a session.
    let link = invite(&server).await;
    browser.goto(&link).await;
    screenshot_if(&browser, shots, "invite").await;
    // An empty name is refused next to the field.
    browser
        .js("document.getElementById('name').removeAttribute('required');")
        .await;
    browser.click("button[type=submit]").await;
    browser.wait_for_text(".error", "display name").await;
    browser.fill("#name", "Grace").await;
    browser.click("button[type=submit]").await;
    browser.wait_for_text("h1", "Open tasks").await;
    browser
        .wait_for_text("main", "Photograph the notice board")
        .await;
    screenshot_if(&browser, shots, "open-tasks").await;
    // The invite worked once.
    let second = driver.browser(&server.base_url).await;
    second.goto(&link).await;
    second.wait_for_text("h1", "Invite not valid").await;
    second.close().await;

    // Claim and start.
    browser.click(&format!("a[href='/app/tasks/{task}']")).await;
    browser.wait_for("#claim").await;
    screenshot_if(&browser, shots, "task-open").await;
    browser.click("#claim").await;
    browser.wait_for("#start").await;
    browser.click("#start").await;
    browser.wait_for_text("#state", "Active").await;

    // A message, with a refused empty one first: the error is next to the form.
    browser
        .js("document.getElementById('message').removeAttribute('required');")
        .await;
    browser.fill("#message", "   ").await;
    browser.click("#send-message").await;
    browser
        .wait_for_text("#message-error", "must not be empty")
        .await;
    browser.fill("#message", "On my way, five minutes.").await;
    browser.click("#send-message").await;
    browser
        .wait_for_text("#feed", "On my way, five minutes.")
        .await;

    // A real JPEG through the file input (with camera metadata to drop).
    let dir = tempfile::tempdir().expect("temporary directory");
    let jpeg = dir.path().join("board.jpg");
    std::fs::write(&jpeg, images::jpeg_with_exif(640, 480, "SECRET-GPS-MARKER"))
        .expect("write JPEG");
    let input = browser.wait_for("#photo").await;
    assert_eq!(
        input.attr("accept").await.expect("accept").as_deref(),
        Some("image/*")
    );
    assert_eq!(
        input.attr("capture").await.expect("capture").as_deref(),
        Some("environment")
    );
    input
        .send_keys(&jpeg.display().to_string())
        .await
        .expect("choose the file");
    browser.click("#upload").await;
    browser
        .wait_for_text("#feed", "Photo sent (640 × 480 pixels).")
        .await;

    // A typed issue; the page stays open (no reload) while the agent answers.
    browser
        .fill("#issue-text", "The board is behind a locked glass door.")
        .await;
    browser
        .client
        .find(fantoccini::Locator::Css("#issue-kind"))
        .await
        .expect("issue kind")
        .select_by_value("access_blocked")
        .await
        .expect("choose the kind");
    browser.click("#raise-issue").await;
    browser.wait_for_text("#feed", "locked glass door").await;
    browser.js("window.__sameDocument = 'yes';").await;
    let events = agent_feed_len(&server, task, &agent, 6).await;
    let issue = events
        .iter()
        .find(|e| e["type"] == "worker.issue")
        .expect("the agent sees the issue");
    assert_eq!(issue["data"]["kind"], "access_blocked");
    let issue_id = issue["id"].as_i64().expect("issue id");
    server
        .clarify(task, &agent, issue_id, "Ask at the front desk for the key.")
        .expect_json(StatusCode::OK)
        .await;
    browser
        .wait_for_text("#feed", "Ask at the front desk for the key.")
        .await;
    assert_eq!(
        browser.js("return window.__sameDocument || null;").await,
        json!("yes"),
        "the clarification must appear without a reload"
    );
    if shots {
        browser.screenshot("task-active").await;
        browser
            .js("document.querySelector('#feed li:last-child').scrollIntoView({block: 'center'});")
            .await;
        browser.screenshot("task-conversation").await;
    }
    let photo = events
        .iter()
        .find(|e| e["type"] == "worker.photo")
        .expect("the agent sees the photo");
    let bytes = server
        .agent(&agent)
        .get(photo["data"]["path"].as_str().expect("photo path"))
        .send()
        .await
        .expect("download the photo")
        .bytes()
        .await
        .expect("photo bytes");
    assert_eq!(&bytes[..2], [0xFF, 0xD8], "a JPEG");
    assert!(
        !bytes.windows(17).any(|w| w == b"SECRET-GPS-MARKER"),
        "the metadata is removed"
    );

    // My tasks lists it; then complete.
    browser.goto("/app/my").await;
    browser
        .wait_for_text("main", "Photograph the notice board")
        .await;
    screenshot_if(&browser, shots, "my-tasks").await;
    browser.goto(&format!("/app/tasks/{task}")).await;
    browser
        .fill("#note", "Photo taken through the glass.")
        .await;
    browser.click("#complete").await;
    browser.wait_for_text("#banner", "completed").await;
    assert!(
        !browser.has("#send-message").await,
        "a terminal task is read-only"
    );
    screenshot_if(&browser, shots, "task-completed").await;

    assert_eq!(agent_types(&server, task, &agent).await, FULL_STORY);
    let feed = server.feed(task, &agent).await;
    assert_eq!(feed[3]["data"]["text"], "On my way, five minutes.");
    assert_eq!(feed[7]["data"]["note"], "Photo taken through the glass.");

    // Sign out ends the session on the server: the old cookie is dead.
    let cookie = browser
        .client
        .get_named_cookie("ms_session")
        .await
        .expect("session cookie")
        .value()
        .to_owned();
    browser.click("nav button").await;
    browser.wait_for_text("main", "You are signed out").await;
    screenshot_if(&browser, shots, "sign-in").await;
    let res = server
        .get("/app/tasks")
        .header(COOKIE, format!("ms_session={cookie}"))
        .send()
        .await
        .expect("request with the old cookie");
    // (The client follows the redirect.)
    assert_eq!(
        res.url().path(),
        "/app/login",
        "the old session must be dead"
    );
    browser.close().await;
    if shots {
        eprintln!("screenshots in {}", screenshot_dir().display());
    }
    server.stop().await;
}

/// Creates and publishes a task with this body; returns its id and token.
async fn open_task_with(server: &TestServer, body: Value) -> (Uuid, String) {
    let created = server.create_task_with(body).await;
    let id: Uuid = str_at(&created, "/task/id").parse().expect("task id");
    let token = str_at(&created, "/agent_token");
    server.publish(id, &token).await;
    (id, token)
}

/// Sends a 64 × 48 PNG through the task page's photo form and waits for
/// it in the feed.
async fn send_png(browser: &Browser) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let png = dir.path().join("photo.png");
    std::fs::write(&png, images::png(64, 48)).expect("write PNG");
    browser
        .wait_for("#photo")
        .await
        .send_keys(&png.display().to_string())
        .await
        .expect("choose the file");
    browser.click("#upload").await;
    browser
        .wait_for_text("#feed", "Photo sent (64 × 48 pixels).")
        .await;
}

/// Metres north of a latitude: about 111.2 km a degree.
fn north(lat: f64, metres: f64) -> f64 {
    lat + metres / 111_200.0
}

/// A worker whose phone reports its position: lists the tasks near it
/// nearest first (with distance and address), is refused a start away from
/// a task that requires presence, starts it on site, and sends a photo
/// whose event records the distance.
async fn a_phone_finds_tasks_near_it_and_works_on_site(db: Db) {
    let server = TestServer::start(db).await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser(&server.base_url).await;
    let shots = db == Db::Sqlite;
    let (lat, lon) = (52.52, 13.405);
    let (near, agent) = open_task_with(
        &server,
        json!({
            "description": "Photograph the fountain.",
            "location": { "latitude": north(lat, 300.0), "longitude": lon, "radius_m": 100,
                          "address": "Fountain, Alexanderplatz" },
            "presence": "require",
        }),
    )
    .await;
    open_task_with(
        &server,
        json!({
            "description": "Count the bicycles at the station.",
            "location": { "latitude": north(lat, 2_500.0), "longitude": lon },
            "presence": "flag",
        }),
    )
    .await;
    server.create_open_task("Proofread a menu.").await;
    let (_, worker) = server.register_worker("Ada").await;
    sign_in_with_token(&browser, &worker).await;

    // The phone stands at (lat, lon): "Use my location" lists nearest first.
    browser.set_position(lat, lon, 20.0).await;
    browser.goto("/app/tasks").await;
    browser.wait_for("#locate").await;
    browser.click("#locate").await;
    browser.wait_for_text("h1", "Open tasks near you").await;
    let listed = browser
        .js("return Array.from(document.querySelectorAll('.tasks .card')).map(c => c.innerText)")
        .await;
    let cards: Vec<&str> = listed
        .as_array()
        .expect("cards")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(cards.len(), 3, "{cards:?}");
    assert!(
        cards[0].contains("Photograph the fountain.") && cards[0].contains("300 m away"),
        "{cards:?}"
    );
    assert!(cards[0].contains("Fountain, Alexanderplatz"), "{cards:?}");
    assert!(
        cards[1].contains("Count the bicycles") && cards[1].contains("2.5 km away"),
        "{cards:?}"
    );
    assert!(
        cards[2].contains("Proofread a menu.") && !cards[2].contains("away"),
        "{cards:?}"
    );
    screenshot_if(&browser, shots, "nearby-tasks").await;

    // The task page: its address, and its point as a link the phone's map
    // app opens.
    browser.goto(&format!("/app/tasks/{near}")).await;
    let map = browser.wait_for("#map-link").await;
    let href = map.attr("href").await.expect("href").unwrap_or_default();
    assert!(href.starts_with("geo:52.5226"), "{href}");
    browser.click("#claim").await;
    browser.wait_for("#start").await;
    // 300 m from the fountain, known to 20 m: refused, with the distance.
    browser
        .wait_for_text("form[data-position] .position-status", "will be sent")
        .await;
    browser.click("#start").await;
    browser
        .wait_for_text(".error", "m from the task's place")
        .await;
    assert_eq!(server.task(near, &agent).await["state"], "assigned");
    screenshot_if(&browser, shots, "start-off-site").await;
    // At the fountain: started, then a photo that records where it was taken.
    browser.set_position(north(lat, 310.0), lon, 8.0).await;
    browser.goto(&format!("/app/tasks/{near}")).await;
    browser
        .wait_for_text("form[data-position] .position-status", "accurate to 8 m")
        .await;
    browser.click("#start").await;
    browser.wait_for_text("#state", "Active").await;
    browser
        .wait_for_text("#photo-form .position-status", "will be sent")
        .await;
    send_png(&browser).await;
    let events = agent_feed_len(&server, near, &agent, 4).await;
    let started = events
        .iter()
        .find(|e| e["type"] == "task.started")
        .expect("started");
    let photo = events
        .iter()
        .find(|e| e["type"] == "worker.photo")
        .expect("photo");
    for (event, metres) in [(started, 10.0), (photo, 10.0)] {
        let seen = &event["data"]["position"];
        let d = seen["distance_m"].as_f64().expect("distance");
        assert!((d - metres).abs() < 2.0, "{event}");
        assert_eq!(seen["off_site"], false, "{event}");
        assert_eq!(event["untrusted"], true, "{event}");
    }
}

async fn two_browsers_race_to_claim(db: Db) {
    let server = TestServer::start(db).await;
    let driver = Chromedriver::start().await;
    let (task, agent) = server
        .create_open_task("Count the bicycles at the station.")
        .await;
    let (_, ada) = server.register_worker("Ada").await;
    let (_, bob) = server.register_worker("Bob").await;
    let (a, b) = tokio::join!(
        driver.browser(&server.base_url),
        driver.browser(&server.base_url)
    );
    tokio::join!(sign_in_with_token(&a, &ada), sign_in_with_token(&b, &bob));
    let page = format!("/app/tasks/{task}");
    tokio::join!(a.goto(&page), b.goto(&page));
    tokio::join!(a.wait_for("#claim"), b.wait_for("#claim"));
    tokio::join!(a.click("#claim"), b.click("#claim"));
    tokio::join!(a.wait_for("h1"), b.wait_for("h1"));
    let (wa, wb) = (a.has("#start").await, b.has("#start").await);
    assert!(
        wa ^ wb,
        "exactly one browser holds the task (a: {wa}, b: {wb})"
    );
    let loser = if wa { &b } else { &a };
    loser
        .wait_for_text("main", "another worker claimed this task first")
        .await;
    let assigned = agent_types(&server, task, &agent)
        .await
        .into_iter()
        .filter(|t| t == "task.assigned")
        .count();
    assert_eq!(assigned, 1);
    a.close().await;
    b.close().await;
    server.stop().await;
}

async fn agent_text_is_text_and_forms_need_csrf(db: Db) {
    let server = TestServer::start(db).await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser(&server.base_url).await;
    let hostile = "<script>window.__pwned = 1</script><b>bold</b> <a href=\"https://example.invalid\">click</a>";
    let (task, agent) = server.create_open_task(hostile).await;
    join(&browser, &invite(&server).await, "Grace").await;
    browser.goto(&format!("/app/tasks/{task}")).await;
    assert_eq!(browser.text("#description").await, hostile);
    assert_eq!(
        browser.js("return window.__pwned === undefined;").await,
        json!(true)
    );
    assert_eq!(
        browser
            .js("return document.querySelectorAll('#description *').length;")
            .await,
        json!(0),
        "no element was made from the agent's text"
    );

    // The claim form without its token, then with a forged one: refused, and
    // the task stays open.
    browser
        .js("document.querySelector('form[action$=\"/claim\"] input[name=csrf]').remove();")
        .await;
    browser.click("#claim").await;
    browser.wait_for_text("h1", "Form refused").await;
    browser.goto(&format!("/app/tasks/{task}")).await;
    browser
        .js("document.querySelector('form[action$=\"/claim\"] input[name=csrf]').value = 'forged';")
        .await;
    browser.click("#claim").await;
    browser.wait_for_text("h1", "Form refused").await;
    assert_eq!(server.task(task, &agent).await["state"], "open");

    // With the token it works.
    browser.goto(&format!("/app/tasks/{task}")).await;
    browser.click("#claim").await;
    browser.wait_for("#start").await;
    assert_eq!(server.task(task, &agent).await["state"], "assigned");

    // Stop needs the confirmation box; text typed is kept on the error.
    browser
        .js("document.getElementById('stop-confirm').removeAttribute('required');")
        .await;
    browser
        .fill("#reason", "The station is closed today.")
        .await;
    browser.click("#stop").await;
    browser
        .wait_for_text("main", "Tick the box to confirm")
        .await;
    let kept = browser
        .js("return document.getElementById('reason').value;")
        .await;
    assert_eq!(kept, json!("The station is closed today."));
    assert_eq!(server.task(task, &agent).await["state"], "assigned");
    browser.click("#stop-confirm").await;
    browser.click("#stop").await;
    browser.wait_for_text("#banner", "stopped").await;
    assert_eq!(server.task(task, &agent).await["state"], "stopped");

    // The page forbids inline script and foreign origins.
    let res = server.get("/app/login").send().await.expect("login page");
    let csp = res.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    browser.close().await;
    server.stop().await;
}

/// A task asking for a typed result with review, on a phone: the worker
/// sends a photo, fills the form (a number refused first, next to its
/// field), picks the photo and sends it for review; the agent asks for a
/// revision, which the open page shows with the form again; the worker
/// changes an answer and sends again; the agent accepts, and the page
/// shows the task completed. The agent receives exactly what was filled in.
async fn a_phone_fills_a_typed_form_through_a_revision(db: Db) {
    let server = TestServer::start(db).await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser(&server.base_url).await;
    let shots = db == Db::Sqlite;
    let (task, agent) = open_task_with(
        &server,
        json!({
            "description": "Check the bike shed behind the library.",
            "result_schema": {
                "type": "object",
                "required": ["locked", "bikes", "photos"],
                "properties": {
                    "locked": { "type": "boolean", "title": "Is the shed locked?" },
                    "bikes": { "type": "integer", "title": "How many bikes are inside?",
                               "minimum": 0, "maximum": 200 },
                    "condition": { "type": "string", "title": "State of the roof",
                                   "enum": ["good", "leaking", "missing"] },
                    "notes": { "type": "string", "title": "Anything else", "maxLength": 100 },
                    "photos": { "type": "array", "title": "Photo of the shed",
                                "items": { "type": "string", "format": "photo" },
                                "minItems": 1, "maxItems": 1 }
                }
            },
            "review": { "auto_accept_seconds": 3600 },
        }),
    )
    .await;
    let (_, worker_token) = server.register_worker("Kim").await;
    sign_in_with_token(&browser, &worker_token).await;
    browser.goto(&format!("/app/tasks/{task}")).await;
    browser.click("#claim").await;
    browser.wait_for("#start").await;
    browser.click("#start").await;
    browser.wait_for_text("#state", "Active").await;

    // A photo first, then the form offers it to pick.
    send_png(&browser).await;
    browser.goto(&format!("/app/tasks/{task}")).await;

    // Each type has its input, labelled with the field's title.
    browser
        .wait_for_text("#complete-form", "Is the shed locked?")
        .await;
    let input_type = |css: &'static str| {
        let browser = &browser;
        async move {
            browser
                .wait_for(css)
                .await
                .attr("type")
                .await
                .expect("type")
                .unwrap_or_default()
        }
    };
    assert_eq!(input_type("input[name='r.locked']").await, "radio");
    assert_eq!(input_type("input[name='r.bikes']").await, "number");
    assert_eq!(input_type("input[name='r.photos']").await, "checkbox");
    assert!(browser.has("select[name='r.condition']").await);
    assert_eq!(
        browser
            .wait_for("input[name='r.bikes']")
            .await
            .attr("inputmode")
            .await
            .expect("inputmode")
            .as_deref(),
        Some("numeric")
    );
    assert!(
        browser.has("#complete-form img.thumb").await,
        "the photo is shown to pick"
    );

    // Out of bounds (the browser's own check removed): refused next to the field.
    browser
        .js("document.querySelector(\"input[name='r.bikes']\").removeAttribute('max');")
        .await;
    browser.click("input[name='r.locked'][value='true']").await;
    browser.fill("input[name='r.bikes']", "500").await;
    browser.click("input[name='r.photos']").await;
    browser
        .client
        .find(fantoccini::Locator::Css("select[name='r.condition']"))
        .await
        .expect("roof select")
        .select_by_value("leaking")
        .await
        .expect("choose");
    browser
        .js("document.getElementById('complete-form').scrollIntoView();")
        .await;
    screenshot_if(&browser, shots, "task-result-form").await;
    browser.click("#complete").await;
    browser.wait_for_text("#result-0-field .error", "200").await;
    // What was typed is kept; the corrected form goes for review.
    browser.fill("input[name='r.bikes']", "12").await;
    browser.click("#complete").await;
    browser
        .wait_for_text("#awaiting-review", "checking your work")
        .await;
    assert!(!browser.has("#complete-form").await);

    let feed = server.feed(task, &agent).await;
    let submitted = feed
        .iter()
        .find(|e| e["type"] == "task.submitted")
        .expect("submitted");
    let photo = feed
        .iter()
        .find(|e| e["type"] == "worker.photo")
        .expect("photo")["data"]["photo_id"]
        .clone();
    assert_eq!(
        submitted["data"]["result"],
        json!({ "locked": true, "bikes": 12, "condition": "leaking", "photos": [photo] })
    );

    // The agent asks for changes: the open page shows them with the form.
    browser.js("window.__beforeRevision = 'yes';").await;
    server
        .agent(&agent)
        .post(&format!("/api/v1/tasks/{task}/review"))
        .json(&json!({ "action": "revise", "text": "Count the bikes outside too." }))
        .expect_json(StatusCode::OK)
        .await;
    browser
        .wait_for_text("#feedback", "Count the bikes outside too.")
        .await;
    assert_eq!(
        browser.js("return window.__beforeRevision || null;").await,
        Value::Null
    );
    browser
        .js("document.getElementById('complete-form').scrollIntoView();")
        .await;
    screenshot_if(&browser, shots, "task-revision").await;
    browser.assert_no_horizontal_overflow("task-revision").await;
    // The form starts from the answers sent before: only the count changes.
    assert_eq!(
        browser
            .wait_for("input[name='r.bikes']")
            .await
            .prop("value")
            .await
            .expect("value")
            .as_deref(),
        Some("12")
    );
    browser.fill("input[name='r.bikes']", "19").await;
    browser.click("#complete").await;
    browser.wait_for("#awaiting-review").await;

    // The agent accepts: the page shows the task completed.
    server
        .agent(&agent)
        .post(&format!("/api/v1/tasks/{task}/review"))
        .json(&json!({ "action": "accept" }))
        .expect_json(StatusCode::OK)
        .await;
    browser.wait_for_text("#banner", "completed").await;
    browser
        .wait_for_text("#feed", "The agent accepted your work")
        .await;
    let done = server.task(task, &agent).await;
    assert_eq!(done["state"], "completed");
    assert_eq!(
        done["result"],
        json!({ "locked": true, "bikes": 19, "condition": "leaking", "photos": [photo] })
    );
    browser.close().await;
    server.stop().await;
}

/// The Settings page at phone width: the worker sets its area from the
/// device's position, opts in to new tasks and email, and sees it kept; a
/// bad address is refused on the page; the browser's side of push runs as
/// far as a browser without a push service can take it (the service worker
/// registers, and turning push on says why it cannot).
async fn a_phone_sets_its_area_and_opts_in_to_email(db: Db) {
    let server = TestServer::start(db).await;
    let driver = Chromedriver::start().await;
    let browser = driver.browser(&server.base_url).await;
    let (worker_id, worker) = server.register_worker("Ada").await;
    sign_in_with_token(&browser, &worker).await;
    browser.set_position(52.52, 13.405, 20.0).await;
    browser.goto("/app/settings").await;
    browser.wait_for_text("h1", "What you are told").await;
    browser.wait_for("#use-position").await;
    browser.click("#use-position").await;
    browser
        .wait_for_text("#position-status", "Filled in your position")
        .await;
    browser.fill("#radius_km", "3").await;
    browser.click("#new_tasks").await;
    browser.fill("#email", "not an address").await;
    // The browser checks type=email first; the server checks as well.
    browser
        .js("document.getElementById('settings-form').noValidate = true; return null")
        .await;
    browser.click("#save-settings").await;
    browser.wait_for_text("#settings-error", "Email").await;
    browser.fill("#email", "ada@example.org").await;
    browser.click("#save-settings").await;
    browser.wait_for_text("[role=status]", "Saved.").await;
    let prefs = server
        .store
        .preferences(worker_id)
        .await
        .unwrap()
        .expect("the worker");
    let area = prefs.area.expect("an area");
    assert_eq!(
        (area.latitude, area.longitude, area.radius_m),
        (52.52, 13.405, 3000)
    );
    assert!(prefs.new_tasks && prefs.my_tasks);
    assert_eq!(prefs.email.as_deref(), Some("ada@example.org"));
    browser.assert_no_horizontal_overflow("settings").await;
    if db == Db::Sqlite {
        browser.screenshot("worker-app-settings").await;
    }

    // Push: the service worker registers; without a push service the
    // subscription fails and the page says so (no silent failure).
    browser.wait_for("#push[data-worker=registered]").await;
    browser.wait_for("#push-on").await;
    browser.click("#push-on").await;
    browser
        .wait_for_text("#push-status", "could not be turned on here")
        .await;
    assert!(
        server
            .store
            .push_subscriptions(worker_id)
            .await
            .unwrap()
            .is_empty()
    );
    browser.close().await;
    server.stop().await;
}

meatspace_tests::api_tests!(
    a_phone_sets_its_area_and_opts_in_to_email,
    end_to_end,
    two_browsers_race_to_claim,
    agent_text_is_text_and_forms_need_csrf,
    a_phone_finds_tasks_near_it_and_works_on_site,
    a_phone_fills_a_typed_form_through_a_revision,
);
