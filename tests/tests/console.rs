//! The operator console's sign-in, session and pages, over real HTTP on
//! both backends: who gets in (an operator key, the development key; not
//! a wrong key, not an agent's key), what the session cookie is, the
//! refusals of every handler (no session, an expired one, a form from
//! another origin or without its CSRF token), that signing in and out is
//! audited, that the overview and the audit trail (and its CSV) show what
//! happened, and that revoking the key ends its console sessions on a
//! second replica at once.

use std::num::NonZeroU32;
use std::time::Duration;

use chrono::TimeDelta;
use meatspace_api::http::rate_limit::RateLimitSettings;
use meatspace_tests::browser::Chromedriver;
use meatspace_tests::server::{Expect, ServerOptions, TestServer, array_at, str_at, uuid_at};
use meatspace_tests::{Db, TestDb};
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::{Client, Method, StatusCode};
use serde_json::json;
use uuid::Uuid;

meatspace_tests::api_tests!(
    an_operator_signs_in_sees_the_overview_and_signs_out,
    every_console_page_refuses_without_a_good_session,
    wrong_keys_spend_the_addresss_failed_sign_in_budget,
    the_audit_trail_filters_and_downloads_as_csv,
    the_console_in_chromium_at_phone_and_desktop_width,
    tasks_are_listed_filtered_shown_escaped_and_cancelled_with_a_reason,
    a_task_pages_stream_ends_with_its_session,
    workers_are_found_suspended_reinstated_given_tokens_and_qualified,
    keys_and_invites_are_made_shown_once_rotated_and_revoked,
);

/// A browser-like client: no redirects followed, cookies by hand.
fn client() -> Client {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .unwrap()
}

/// `name=value` of the `Set-Cookie` named `name`, and the whole header.
fn set_cookie(res: &reqwest::Response, name: &str) -> Option<(String, String)> {
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| (v.split(';').next().unwrap().to_owned(), v.to_owned()))
}

fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    html[at..at + html[at..].find('"').unwrap()].to_owned()
}

/// Signs in with `key`: the answer to the sign-in form.
async fn sign_in(srv: &TestServer, http: &Client, key: &str) -> reqwest::Response {
    let page = http.get(srv.url("/console/login")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let (pre, _) = set_cookie(&page, "ms_console_pre").expect("a pre-session cookie");
    let csrf = csrf_of(&page.text().await.unwrap());
    http.post(srv.url("/console/login"))
        .header(COOKIE, &pre)
        .header("origin", &srv.base_url)
        .form(&[("csrf", csrf.as_str()), ("key", key)])
        .send()
        .await
        .unwrap()
}

/// Signs in and returns the session cookie (`name=value`).
async fn session(srv: &TestServer, http: &Client, key: &str) -> String {
    let res = sign_in(srv, http, key).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "signed in");
    set_cookie(&res, "ms_console").expect("a session cookie").0
}

async fn get(http: &Client, srv: &TestServer, path: &str, cookie: &str) -> reqwest::Response {
    http.get(srv.url(path))
        .header(COOKIE, cookie)
        .send()
        .await
        .unwrap()
}

/// A browser signed in to the console: its client and session cookie.
struct Signed<'a> {
    srv: &'a TestServer,
    http: Client,
    cookie: String,
}

impl<'a> Signed<'a> {
    /// Signs in to `srv` with `key`.
    async fn new(srv: &'a TestServer, key: &str) -> Signed<'a> {
        let http = client();
        let cookie = session(srv, &http, key).await;
        Signed { srv, http, cookie }
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        get(&self.http, self.srv, path, &self.cookie).await
    }

    /// The page at `path`, which must answer 200.
    async fn html(&self, path: &str) -> String {
        let res = self.get(path).await;
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        res.text().await.unwrap()
    }

    /// Posts a form to `action` with the CSRF token of the page at
    /// `page_path`, from the console's own origin.
    async fn post_form(
        &self,
        page_path: &str,
        action: &str,
        fields: &[(&str, &str)],
    ) -> reqwest::Response {
        let csrf = csrf_of(&self.html(page_path).await);
        let mut form: Vec<(&str, &str)> = vec![("csrf", csrf.as_str())];
        form.extend_from_slice(fields);
        self.post(action).form(&form).send().await.unwrap()
    }

    /// [`Signed::post_form`], asserting the answer's `status`; returns the
    /// page it answered with.
    async fn submit(
        &self,
        page_path: &str,
        action: &str,
        fields: &[(&str, &str)],
        status: StatusCode,
    ) -> String {
        let res = self.post_form(page_path, action, fields).await;
        assert_eq!(res.status(), status, "{action}");
        res.text().await.unwrap()
    }

    /// A POST to `path` with the session and the console's origin.
    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .post(self.srv.url(path))
            .header(COOKIE, &self.cookie)
            .header("origin", &self.srv.base_url)
    }
}

fn location(res: &reqwest::Response) -> &str {
    res.headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

async fn operator_key(srv: &TestServer, kind: &str) -> (Uuid, String, Uuid) {
    let made = srv
        .dev(Method::POST, "/api/v1/keys")
        .json(&json!({ "name": format!("{kind} key"), "kind": kind }))
        .expect_json(StatusCode::CREATED)
        .await;
    (
        uuid_at(&made, "/key/id"),
        str_at(&made, "/secret"),
        uuid_at(&made, "/key/principal/id"),
    )
}

async fn an_operator_signs_in_sees_the_overview_and_signs_out(db: Db) {
    let srv = TestServer::start(db).await;
    let http = client();
    let (_, secret, principal) = operator_key(&srv, "operator").await;
    srv.create_open_task("Water the plants").await;
    srv.create_task("A draft").await;

    let res = sign_in(&srv, &http, &secret).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&res), "/console");
    let (cookie, header) = set_cookie(&res, "ms_console").expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(header.contains(attribute), "{attribute} in {header}");
    }
    assert!(
        !header.contains(&secret),
        "the key never reaches the cookie"
    );
    let c = Signed {
        srv: &srv,
        http,
        cookie,
    };

    let page = c.get("/console").await;
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"));
    let html = page.text().await.unwrap();
    assert!(html.contains("id=\"count-open\">1<"), "one open task");
    assert!(html.contains("id=\"count-draft\">1<"), "one draft");
    assert!(html.contains("<svg class=\"chart\""));
    assert!(html.contains("id=\"day-created\">2<"));

    // Signing out ends the session on the server.
    let out = c.post_form("/console", "/console/logout", &[]).await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&out), "/console/login?signed_out=1");
    let after = c.get("/console").await;
    assert_eq!(after.status(), StatusCode::SEE_OTHER);
    assert!(location(&after).starts_with("/console/login"));

    // Both are in the trail, as the key's principal.
    let trail = srv
        .dev_get_json(&format!("/api/v1/audit?principal={principal}"))
        .await;
    let actions: Vec<&str> = array_at(&trail, "/entries")
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["console.signed_out", "console.signed_in"]);

    // The development key signs in too (it is on here).
    Signed::new(&srv, &srv.dev_key).await;
}

async fn every_console_page_refuses_without_a_good_session(db: Db) {
    let srv = TestServer::start(db).await;
    let http = client();
    // No session: every page and every action sends the browser to sign
    // in, and changes nothing.
    let (task, _) = srv.create_open_task("Water the plants").await;
    let (worker, _) = srv.register_worker("Ada").await;
    let (key, _, _) = operator_key(&srv, "agent").await;
    let nil = Uuid::nil();
    let pages = [
        "/console".to_owned(),
        "/console/audit".to_owned(),
        "/console/audit.csv".to_owned(),
        "/console/tasks".to_owned(),
        format!("/console/tasks/{task}"),
        format!("/console/tasks/{task}/stream?after=0"),
        format!("/console/tasks/{task}/photos/{nil}"),
        "/console/workers".to_owned(),
        format!("/console/workers/{worker}"),
        "/console/keys".to_owned(),
        "/console/invites".to_owned(),
    ];
    for path in &pages {
        let res = get(&http, &srv, path, "").await;
        assert_eq!(res.status(), StatusCode::SEE_OTHER, "{path}");
        assert_eq!(location(&res), "/console/login", "{path}");
    }
    let actions = [
        "/console/logout".to_owned(),
        format!("/console/tasks/{task}/cancel"),
        format!("/console/workers/{worker}/suspend"),
        format!("/console/workers/{worker}/reinstate"),
        format!("/console/workers/{worker}/rotate"),
        format!("/console/workers/{worker}/qualifications"),
        format!("/console/workers/{worker}/qualifications/vehicle/revoke"),
        "/console/keys".to_owned(),
        format!("/console/keys/{key}/rotate"),
        format!("/console/keys/{key}/revoke"),
        "/console/invites".to_owned(),
        format!("/console/invites/{nil}/revoke"),
    ];
    for path in &actions {
        let res = http
            .post(srv.url(path))
            .header("origin", &srv.base_url)
            .form(&[("reason", "x"), ("name", "vehicle")])
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::SEE_OTHER, "{path}");
        assert_eq!(location(&res), "/console/login", "{path}");
    }
    assert_eq!(
        srv.store.task(task).await.unwrap().unwrap().state,
        meatspace_domain::TaskState::Open
    );
    assert!(
        srv.store
            .worker(worker)
            .await
            .unwrap()
            .unwrap()
            .suspended_at
            .is_none()
    );
    // A made-up session cookie is no session.
    let forged = format!(
        "ms_console=mcs_{}_bm90IGEgc2VjcmV0",
        Uuid::new_v4().simple()
    );
    let res = get(&http, &srv, "/console", &forged).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);

    // A wrong key: 401, and the key is not echoed.
    let res = sign_in(&srv, &http, "msk_not-a-key").await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert!(!res.text().await.unwrap().contains("msk_not-a-key"));
    // An agent's key is valid but not an operator's: 403.
    let (_, agent_secret, _) = operator_key(&srv, "agent").await;
    let res = sign_in(&srv, &http, &agent_secret).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(set_cookie(&res, "ms_console").is_none());

    // A sign-in form posted from another origin is refused.
    let (_, secret, _) = operator_key(&srv, "operator").await;
    let page = http.get(srv.url("/console/login")).send().await.unwrap();
    let (pre, _) = set_cookie(&page, "ms_console_pre").unwrap();
    let csrf = csrf_of(&page.text().await.unwrap());
    let res = http
        .post(srv.url("/console/login"))
        .header(COOKIE, &pre)
        .header("origin", "https://evil.example")
        .form(&[("csrf", csrf.as_str()), ("key", secret.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(set_cookie(&res, "ms_console").is_none());
    // ... and so is one without its CSRF token.
    let res = http
        .post(srv.url("/console/login"))
        .header(COOKIE, &pre)
        .header("origin", &srv.base_url)
        .form(&[("key", secret.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);

    // Sign-out needs the session's CSRF token.
    let c = Signed::new(&srv, &secret).await;
    let res = c
        .post("/console/logout")
        .form(&[("csrf", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(c.get("/console").await.status(), StatusCode::OK);

    // Idle for 31 minutes: the session has ended, for every page.
    srv.advance_clock(TimeDelta::minutes(31));
    let res = c.get("/console").await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(location(&res), "/console/login?expired=1");
    for path in &pages {
        let res = c.get(path).await;
        assert_eq!(res.status(), StatusCode::SEE_OTHER, "{path}");
        assert!(location(&res).starts_with("/console/login"), "{path}");
    }

    // Active, but 12 hours after signing in: ended too.
    let c = Signed::new(&srv, &secret).await;
    for _ in 0..25 {
        srv.advance_clock(TimeDelta::minutes(29));
        if c.get("/console").await.status() != StatusCode::OK {
            break;
        }
    }
    let res = c.get("/console").await;
    assert_eq!(
        res.status(),
        StatusCode::SEE_OTHER,
        "no session outlives 12 hours"
    );
}

/// Wrong keys at the console's sign-in spend the address's budget of failed
/// authentications, as wrong credentials on the API do: past it, the
/// address is answered 429 before anything is checked.
async fn wrong_keys_spend_the_addresss_failed_sign_in_budget(db: Db) {
    let srv = TestServer::start_configured(db, |o| {
        o.rate_limit = RateLimitSettings {
            auth_failures_per_minute: NonZeroU32::new(1),
            auth_failures_burst: NonZeroU32::new(3).unwrap(),
            ..RateLimitSettings::OFF
        }
    })
    .await;
    let http = client();
    for _ in 0..3 {
        let res = sign_in(&srv, &http, "msk_not-a-key").await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    }
    let res = http.get(srv.url("/console/login")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
}

async fn the_audit_trail_filters_and_downloads_as_csv(db: Db) {
    let srv = TestServer::start(db).await;
    let (_, secret, principal) = operator_key(&srv, "operator").await;
    let (_, _, agent) = operator_key(&srv, "agent").await;
    let c = Signed::new(&srv, &secret).await;
    let html = c.html("/console/audit?action=key.created").await;
    assert_eq!(html.matches("<td>key.created</td>").count(), 2, "{html}");
    assert!(!html.contains("<td>console.signed_in</td>"));
    let html = c
        .html(&format!("/console/audit?principal={principal}"))
        .await;
    assert!(html.contains("<td>console.signed_in</td>"));
    assert!(!html.contains("<td>key.created</td>"));
    let bad = c.get("/console/audit?action=nonsense").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);

    let csv = c.get("/console/audit.csv?action=key.created").await;
    assert_eq!(csv.status(), StatusCode::OK);
    assert!(
        csv.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv")
    );
    let body = csv.text().await.unwrap();
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(
        lines[0],
        "id,at,principal_id,principal_kind,principal_name,action,target,address,detail"
    );
    assert_eq!(lines.len(), 3, "{body}");
    assert!(lines[1..].iter().all(|l| l.contains(",key.created,")));
    // The agent's principal has done nothing yet.
    let html = c.html(&format!("/console/audit?principal={agent}")).await;
    assert!(!html.contains("<td>key.created</td>") && !html.contains("<td>console."));
}

/// Revoking a key ends its console sessions on every replica at once:
/// the second server had the key in memory and hears of the revocation
/// from the change stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_key_ends_its_console_session_on_a_second_replica() {
    let first = TestServer::start(Db::Postgres).await;
    let replica = TestDb::replica(&first.db);
    let second = TestServer::start_on(Db::Postgres, replica, ServerOptions::default()).await;
    let (key, secret, _) = operator_key(&first, "operator").await;
    let c = Signed::new(&second, &secret).await;
    c.html("/console").await;
    first
        .dev(Method::POST, &format!("/api/v1/keys/{key}/revoke"))
        .expect_json(StatusCode::OK)
        .await;
    let (_, took) = meatspace_tests::eventually_timed(
        std::time::Duration::from_secs(10),
        "the console session to end",
        || async { (c.get("/console").await.status() == StatusCode::SEE_OTHER).then_some(()) },
    )
    .await;
    println!(
        "console session refused {} ms after the revocation",
        took.as_millis()
    );
}

/// The console in real Chromium: signing in, the overview and the audit
/// trail at 360 px and at 1,280 px without sideways scrolling, a filter,
/// and signing out. Screenshots go to `target/web-screenshots/console-*`.
async fn the_console_in_chromium_at_phone_and_desktop_width(db: Db) {
    let srv = TestServer::start(db).await;
    let (_, secret, _) = operator_key(&srv, "operator").await;
    srv.create_open_task("Water the plants").await;
    let (id, token) = srv.create_open_task("Check the gate").await;
    srv.agent_post(id, &token, "cancel").await;
    let driver = Chromedriver::start().await;
    let shots = db == Db::Sqlite;

    // A phone: sign in, the overview and the audit trail fit 360 px.
    let phone = driver.browser(&srv.base_url).await;
    browser_sign_in(&phone, &secret).await;
    assert_eq!(phone.text("#count-open").await, "1");
    assert_eq!(phone.text("#count-cancelled").await, "1");
    phone.assert_fits("overview on a phone", 360).await;
    if shots {
        phone.capture("console-overview-phone").await;
    }
    // Every page fits the phone.
    let (worker, _) = srv.register_worker("Ada").await;
    for (path, heading) in [
        ("/console/audit".to_owned(), "Audit trail"),
        ("/console/tasks".to_owned(), "Tasks"),
        (format!("/console/tasks/{id}"), "Task"),
        ("/console/workers".to_owned(), "Workers"),
        (format!("/console/workers/{worker}"), "Worker"),
        ("/console/keys".to_owned(), "API keys"),
        ("/console/invites".to_owned(), "Worker invites"),
    ] {
        phone.goto(&path).await;
        phone.wait_for_text("h1", heading).await;
        phone.assert_fits(&path, 360).await;
    }
    // Signing out, by keyboard-reachable button in the header.
    phone.click("header button.link").await;
    phone.wait_for_text("h1", "Sign in to the console").await;
    assert!(phone.text("[role=status]").await.contains("signed out"));
    phone.close().await;

    // A desktop: 1,280 px, a filtered audit trail.
    let desk = driver.desktop(&srv.base_url, 1280, 800).await;
    browser_sign_in(&desk, &secret).await;
    desk.assert_fits("overview on a desktop", 1280).await;
    if shots {
        desk.capture("console-overview").await;
    }
    desk.goto("/console/audit").await;
    desk.wait_for_text("h1", "Audit trail").await;
    desk.js("document.getElementById('action').value = 'console.signed_out'; return null")
        .await;
    desk.click("#filter").await;
    desk.wait_for("#download-csv").await;
    let actions = desk
        .js("return Array.from(document.querySelectorAll('.audit tbody tr td:nth-child(3)')).map(t => t.textContent)")
        .await;
    assert_eq!(
        actions,
        json!(["console.signed_out"]),
        "the phone's sign-out, filtered"
    );
    desk.assert_fits("audit on a desktop", 1280).await;
    if shots {
        desk.capture("console-audit").await;
    }
    // Every other page renders and fits, with a screenshot of each.
    for (path, heading, shot) in [
        ("/console/tasks".to_owned(), "Tasks", "console-tasks"),
        (format!("/console/tasks/{id}"), "Task", "console-task"),
        ("/console/workers".to_owned(), "Workers", "console-workers"),
        (
            format!("/console/workers/{worker}"),
            "Worker",
            "console-worker",
        ),
        ("/console/keys".to_owned(), "API keys", "console-keys"),
        (
            "/console/invites".to_owned(),
            "Worker invites",
            "console-invites",
        ),
    ] {
        desk.goto(&path).await;
        desk.wait_for_text("h1", heading).await;
        desk.assert_fits(&path, 1280).await;
        if shots {
            desk.capture(shot).await;
        }
    }
    // A task's feed grows while its page is open: the worker's message
    // arrives over the page's event stream, as text.
    let live = srv.active_task("Read the meter").await;
    desk.goto(&format!("/console/tasks/{}", live.task_id)).await;
    desk.wait_for_text("#console-feed", "task.started").await;
    srv.message(live.task_id, &live.worker_token, "<b>42</b> kWh")
        .await;
    desk.wait_for_text("#console-feed", "<b>42</b> kWh").await;
    assert!(
        !desk.has("#console-feed b").await,
        "worker text is never markup"
    );
    // An invite link with its QR code.
    desk.goto("/console/invites").await;
    desk.wait_for_text("h1", "Worker invites").await;
    desk.click("#create-invite").await;
    desk.wait_for("#invite-qr svg").await;
    if shots {
        desk.capture("console-invite-created").await;
    }
    desk.close().await;
    srv.stop().await;
}

async fn browser_sign_in(browser: &meatspace_tests::browser::Browser, key: &str) {
    browser.goto("/console").await;
    browser.wait_for_text("h1", "Sign in to the console").await;
    browser.fill("#key", key).await;
    browser.click("#sign-in").await;
    browser.wait_for_text("h1", "Overview").await;
}

async fn tasks_are_listed_filtered_shown_escaped_and_cancelled_with_a_reason(db: Db) {
    let srv = TestServer::start(db).await;
    let (_, secret, principal) = operator_key(&srv, "operator").await;
    let c = Signed::new(&srv, &secret).await;
    let (plants, _) = srv.create_open_task("Water the <b>plants</b> 100%").await;
    srv.create_task("Count the bicycles").await;
    let active = srv.active_task("Check the gate").await;
    srv.message(
        active.task_id,
        &active.worker_token,
        "<script>alert(1)</script> done",
    )
    .await;

    // The list: newest first, filtered by state and by a search.
    let html = c.html("/console/tasks").await;
    assert_eq!(html.matches("href=\"/console/tasks/").count(), 3);
    let html = c.html("/console/tasks?state=open").await;
    assert!(html.contains(&format!("/console/tasks/{plants}")));
    assert_eq!(html.matches("href=\"/console/tasks/").count(), 1);
    let html = c.html("/console/tasks?q=100%25").await;
    assert_eq!(
        html.matches("href=\"/console/tasks/").count(),
        1,
        "% is searched for literally"
    );
    let html = c.html("/console/tasks?q=BICYCLES").await;
    assert!(html.contains("Count the bicycles"));
    let bad = c.get("/console/tasks?state=lost").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);

    // A task's page: agent and worker text are text.
    let html = c.html(&format!("/console/tasks/{}", active.task_id)).await;
    assert!(
        html.contains("&#60;script&#62;alert(1)&#60;/script&#62; done"),
        "{html}"
    );
    assert!(!html.contains("<script>alert(1)"));
    let plants_page = c.html(&format!("/console/tasks/{plants}")).await;
    assert!(plants_page.contains("Water the &#60;b&#62;plants&#60;/b&#62; 100%"));
    let missing = c.get(&format!("/console/tasks/{}", Uuid::new_v4())).await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    // A photo the worker sent is viewable from the task's page.
    srv.worker(&active.worker_token)
        .post(&format!("/api/v1/worker/tasks/{}/photos", active.task_id))
        .header("content-type", "image/png")
        .body(meatspace_tests::server::images::png(8, 8))
        .expect_json(StatusCode::OK)
        .await;
    let page = c.html(&format!("/console/tasks/{}", active.task_id)).await;
    let at = page.find("/photos/").expect("a photo link");
    let href_start = page[..at].rfind('"').unwrap() + 1;
    let href = &page[href_start..at + page[at..].find('"').unwrap()];
    let photo = c.get(href).await;
    assert_eq!(photo.status(), StatusCode::OK);
    assert_eq!(photo.headers()["content-type"], "image/png");

    // Cancelling needs a reason and the session's CSRF token.
    let csrf = csrf_of(&html);
    let post = |form: Vec<(&'static str, String)>, origin: &str| {
        c.http
            .post(srv.url(&format!("/console/tasks/{}/cancel", active.task_id)))
            .header(COOKIE, &c.cookie)
            .header("origin", origin.to_owned())
            .form(&form)
            .send()
    };
    let res = post(
        vec![("csrf", csrf.clone()), ("reason", " ".into())],
        &srv.base_url,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert!(res.text().await.unwrap().contains("Give a reason"));
    let res = post(
        vec![("csrf", csrf.clone()), ("reason", "duplicate".into())],
        "https://evil.example",
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let res = post(
        vec![("csrf", csrf.clone()), ("reason", "duplicate".into())],
        &srv.base_url,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    let task = srv.task(active.task_id, &active.agent_token).await;
    assert_eq!(task["state"], "cancelled");
    let feed = srv.feed(active.task_id, &active.agent_token).await;
    let last = feed.last().unwrap();
    assert_eq!(last["type"], "task.cancelled");
    assert_eq!(last["data"]["reason"], "duplicate");
    // Audited as the signed-in operator, with the reason.
    let trail = srv
        .dev_get_json(&format!(
            "/api/v1/audit?principal={principal}&action=task.cancelled_by_operator"
        ))
        .await;
    let entry = &trail["entries"][0];
    assert_eq!(entry["target"], format!("task:{}", active.task_id));
    assert_eq!(entry["detail"]["reason"], "duplicate");
    // A cancelled task has no cancel form left.
    let html = c.html(&format!("/console/tasks/{}", active.task_id)).await;
    assert!(!html.contains("id=\"cancel-task\""));

    // The page's live feed is the task's event stream, each event in
    // words with worker text as data; it ends after the terminal event.
    let res = c
        .get(&format!("/console/tasks/{}/stream?after=0", active.task_id))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let body = res.text().await.unwrap();
    let items: Vec<serde_json::Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(items.len(), feed.len(), "{body}");
    assert!(
        items
            .iter()
            .any(|i| i["text"] == "<script>alert(1)</script> done" && i["actor"] == "worker")
    );
    let last = items.last().unwrap();
    assert_eq!(last["kind"], "task.cancelled");
    assert_eq!(last["terminal"], true);
    assert!(
        items[..items.len() - 1]
            .iter()
            .all(|i| i["terminal"] == false)
    );
    // Resumed after the last event a browser had, it sends only the rest.
    let res = c
        .http
        .get(srv.url(&format!("/console/tasks/{}/stream", active.task_id)))
        .header(COOKIE, &c.cookie)
        .header("last-event-id", items[items.len() - 2]["id"].to_string())
        .send()
        .await
        .unwrap();
    let rest = res.text().await.unwrap();
    assert_eq!(rest.matches("data: ").count(), 1, "{rest}");
}

/// A task page's stream sends nothing more once its session has ended: with
/// the key it signed in with revoked, the task's next event ends the stream
/// instead of reaching the page.
async fn a_task_pages_stream_ends_with_its_session(db: Db) {
    let srv = TestServer::start(db).await;
    let (key, secret, _) = operator_key(&srv, "operator").await;
    let c = Signed::new(&srv, &secret).await;
    let t = srv.active_task("Read the meter").await;
    let mut res = c
        .get(&format!("/console/tasks/{}/stream?after=0", t.task_id))
        .await;
    assert_eq!(res.status(), StatusCode::OK);
    let mut seen = String::new();
    while !seen.contains("task.started") {
        let chunk = res.chunk().await.unwrap().expect("the stream goes on");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    srv.dev(Method::POST, &format!("/api/v1/keys/{key}/revoke"))
        .expect_json(StatusCode::OK)
        .await;
    assert_eq!(c.get("/console").await.status(), StatusCode::SEE_OTHER);
    srv.message(t.task_id, &t.worker_token, "after the revocation")
        .await;
    let rest = async {
        while let Some(chunk) = res.chunk().await.unwrap() {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    };
    tokio::time::timeout(Duration::from_secs(60), rest)
        .await
        .expect("the stream ends");
    assert!(!seen.contains("after the revocation"), "{seen}");
}

async fn workers_are_found_suspended_reinstated_given_tokens_and_qualified(db: Db) {
    let srv = TestServer::start(db).await;
    let (_, secret, _) = operator_key(&srv, "operator").await;
    let c = Signed::new(&srv, &secret).await;
    let (ada, ada_token) = srv.register_worker("Ada <i>Lovelace</i>").await;
    srv.register_worker("Bea").await;

    let html = c.html("/console/workers?q=lovelace").await;
    assert!(html.contains(&format!("/console/workers/{ada}")));
    assert!(
        html.contains("Ada &#60;i&#62;Lovelace&#60;/i&#62;"),
        "names are text: {html}"
    );
    assert!(!html.contains("Bea"));
    let page = format!("/console/workers/{ada}");
    // An action of the worker's page, answered with `status`.
    let act = async |action: &str, fields: &[(&str, &str)], status| {
        c.submit(&page, &format!("{page}/{action}"), fields, status)
            .await
    };

    // Suspend with a reason, then reinstate: both in the worker's history.
    act("suspend", &[("reason", "no-show")], StatusCode::SEE_OTHER).await;
    srv.assert_worker_token(&ada_token, false).await;
    let html = c.html(&page).await;
    assert!(html.contains("suspended since"));
    assert!(html.contains("worker.suspended") && html.contains("no-show"));
    act("reinstate", &[], StatusCode::SEE_OTHER).await;
    srv.assert_worker_token(&ada_token, true).await;

    // A new token, shown once; the old one stops working.
    let html = act("rotate", &[], StatusCode::OK).await;
    let token = text_of(&html, "new-token");
    srv.assert_worker_token(&ada_token, false).await;
    srv.assert_worker_token(&token, true).await;
    let again = c.html(&page).await;
    assert!(!again.contains(&token), "a token is shown once");

    // Qualifications: granted, refused when malformed, revoked.
    act(
        "qualifications",
        &[("name", "vehicle"), ("value", "car")],
        StatusCode::SEE_OTHER,
    )
    .await;
    let qualifications = async || {
        srv.worker(&token)
            .get_json("/api/v1/worker/qualifications")
            .await["qualifications"]
            .clone()
    };
    assert_eq!(qualifications().await[0]["value"], "car");
    let refused = act(
        "qualifications",
        &[("name", "Not A Name")],
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert!(refused.contains("id=\"worker-error\""));
    act("qualifications/vehicle/revoke", &[], StatusCode::SEE_OTHER).await;
    assert_eq!(qualifications().await.as_array().unwrap().len(), 0);
    let html = c.html(&page).await;
    for action in [
        "worker.token_rotated",
        "worker.qualified",
        "worker.unqualified",
        "worker.reinstated",
    ] {
        assert!(html.contains(action), "{action} in the history");
    }
    // An action without the session's token changes nothing.
    let res = c
        .post(&format!("{page}/suspend"))
        .form(&[("reason", "x")])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    srv.assert_worker_token(&token, true).await;
}

/// The text of the element with id `id` in `html`.
fn text_of(html: &str, id: &str) -> String {
    let at = html
        .find(&format!("id=\"{id}\">"))
        .unwrap_or_else(|| panic!("#{id} in {html}"))
        + id.len()
        + 6;
    html[at..at + html[at..].find('<').unwrap()].to_owned()
}

async fn keys_and_invites_are_made_shown_once_rotated_and_revoked(db: Db) {
    let srv = TestServer::start(db).await;
    let (_, secret, _) = operator_key(&srv, "operator").await;
    let c = Signed::new(&srv, &secret).await;

    // A key for a new agent, with two scopes: its secret shown once.
    let html = c
        .submit(
            "/console/keys",
            "/console/keys",
            &[
                ("name", "robot"),
                ("kind", "agent"),
                ("scope", "tasks"),
                ("scope", "invites"),
            ],
            StatusCode::OK,
        )
        .await;
    let robot = text_of(&html, "new-secret");
    assert!(robot.starts_with("msk_"));
    assert!(html.contains("tasks invites"), "both scopes: {html}");
    srv.assert_agent_key(&robot, true).await;
    let list = c.html("/console/keys").await;
    assert!(!list.contains(&robot), "a secret is shown once");
    let (task, _) = srv
        .agent(&robot)
        .post("/api/v1/tasks")
        .json(&json!({ "description": "Fetch the mail" }))
        .expect_json(StatusCode::CREATED)
        .await
        .pipe(|v| (uuid_at(&v, "/task/id"), ()));
    let robot_id = {
        let keys = srv.dev_get_json("/api/v1/keys").await;
        uuid_at(
            array_at(&keys, "/keys")
                .iter()
                .find(|k| k["name"] == "robot")
                .unwrap(),
            "/id",
        )
    };

    // An action on the robot's key, from the key list.
    let act = async |action: &str, fields: &[(&str, &str)]| {
        let action = format!("/console/keys/{robot_id}/{action}");
        c.submit("/console/keys", &action, fields, StatusCode::OK)
            .await
    };

    // Rotated with no grace: the old secret stops at once, the new works.
    let rotated = text_of(&act("rotate", &[("grace_hours", "0")]).await, "new-secret");
    srv.assert_agent_key(&robot, false).await;
    srv.assert_agent_key(&rotated, true).await;

    // Revoked, cancelling its principal's tasks.
    let revocation = act("revoke", &[("cancel_tasks", "on")]).await;
    assert!(text_of(&revocation, "keys-notice").contains("1 of its principal"));
    srv.assert_agent_key(&rotated, false).await;
    let cancelled = srv.store.task(task).await.unwrap().expect("the task");
    assert_eq!(cancelled.state, meatspace_domain::TaskState::Cancelled);

    // An invite: the link once, with a QR code; it signs up, until revoked.
    let html = c
        .submit(
            "/console/invites",
            "/console/invites",
            &[("hours", "2")],
            StatusCode::OK,
        )
        .await;
    let link = text_of(&html, "invite-url");
    assert!(
        link.starts_with(&format!("{}/app/invite/msi_", srv.base_url)),
        "{link}"
    );
    assert!(html.contains("<svg"), "a QR code");
    assert_eq!(
        c.http.get(&link).send().await.unwrap().status(),
        StatusCode::OK
    );
    let list = c.html("/console/invites").await;
    assert!(!list.contains(&link), "a link is shown once");
    let invites = srv.dev_get_json("/api/v1/workers/invites").await;
    let invite = uuid_at(&invites["invites"][0], "/id");
    c.submit(
        "/console/invites",
        &format!("/console/invites/{invite}/revoke"),
        &[],
        StatusCode::SEE_OTHER,
    )
    .await;
    assert_eq!(
        c.http.get(&link).send().await.unwrap().status(),
        StatusCode::GONE
    );
    let list = c.html("/console/invites").await;
    assert!(list.contains("<td>revoked</td>"));
}

/// `value.pipe(f)`: `f(value)`, for a chain.
trait Pipe: Sized {
    fn pipe<T>(self, f: impl FnOnce(Self) -> T) -> T {
        f(self)
    }
}
impl<T> Pipe for T {}
