//! The worker web app over plain HTTP (no browser): the invite route's JSON
//! contract, the session cookie's attributes, CSRF refusals, the security
//! headers and the redirects of pages that need a session.

use meatspace_api::public_url::PublicOrigin;
use meatspace_tests::Db;
use meatspace_tests::api_tests;
use meatspace_tests::server::web::{
    client as no_redirects, cookie_pair, csrf_of, get_with, login_page, post_form, post_login,
    same_origin, sign_in, sign_in_with,
};
use meatspace_tests::server::{Expect, TestServer, header_str, str_at};
use reqwest::header::{CONTENT_TYPE, LOCATION};
use reqwest::{Method, StatusCode};
use serde_json::json;

api_tests!(
    a_public_url_decides_links_and_cookies_not_the_client,
    session_forms_from_other_origins_are_refused,
    invites_need_the_dev_key_and_a_valid_lifetime,
    an_invite_signs_a_person_in_once,
    a_revoked_invite_link_shows_no_form,
    pages_need_a_session_and_forms_their_token,
    the_pages_live_feed_takes_a_capped_place,
    a_worker_sees_only_its_own_assignments_photos,
    the_app_shows_a_workers_qualifications_and_only_tasks_for_it,
);

/// Whether the answer is an HTML page.
fn is_html(res: &reqwest::Response) -> bool {
    header_str(res, CONTENT_TYPE)
        .unwrap_or_default()
        .starts_with("text/html")
}

async fn create_invite(srv: &TestServer) -> String {
    let body = srv
        .dev(Method::POST, "/api/v1/workers/invites")
        .expect_json(StatusCode::CREATED)
        .await;
    str_at(&body, "/invite_url")
}

async fn a_public_url_decides_links_and_cookies_not_the_client(db: Db) {
    // The review's attack: `Host: evil.example` minted invite links to the
    // attacker's site, and a proxy without X-Forwarded-Proto got cookies
    // without Secure. With MEATSPACE_PUBLIC_URL neither header counts.
    let srv = TestServer::start_configured(db, |o| {
        o.public_origin = PublicOrigin::parse("https://meatspace.example.test").unwrap()
    })
    .await;
    let http = no_redirects();
    for (host, proto) in [("evil.example", "http"), ("127.0.0.1", "https")] {
        let body = srv
            .dev(Method::POST, "/api/v1/workers/invites")
            .header("host", host)
            .header("x-forwarded-proto", proto)
            .expect_json(StatusCode::CREATED)
            .await;
        let link = str_at(&body, "/invite_url");
        assert!(
            link.starts_with("https://meatspace.example.test/app/invite/msi_"),
            "{link}"
        );
    }
    // The link's path works on this server; no proxy header is sent, and
    // still the cookies are the secure ones.
    let body = srv
        .dev(Method::POST, "/api/v1/workers/invites")
        .expect_json(StatusCode::CREATED)
        .await;
    let path = str_at(&body, "/invite_url").replace("https://meatspace.example.test", "");
    let page = http.get(srv.url(&path)).send().await.expect("invite page");
    assert_eq!(page.status(), StatusCode::OK);
    assert!(cookie_pair(&page, "ms_presession").is_none());
    let (pre, attrs) = cookie_pair(&page, "__Host-ms_presession").expect("__Host- cookie");
    assert!(
        attrs.contains("Secure") && attrs.contains("Path=/;"),
        "{attrs}"
    );
    let csrf = csrf_of(&page.text().await.expect("page"));
    // The browser's Origin is the public one, not the address it connected to.
    let form = [("csrf", csrf.as_str()), ("name", "Grace")];
    let refused = post_form(
        &http,
        &srv.url(&path),
        &pre,
        &[("origin", &srv.base_url)],
        &form,
    )
    .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let joined = post_form(
        &http,
        &srv.url(&path),
        &pre,
        &same_origin("https://meatspace.example.test"),
        &form,
    )
    .await;
    assert_eq!(joined.status(), StatusCode::SEE_OTHER);
    let (_, attrs) = cookie_pair(&joined, "ms_session").expect("a session cookie");
    assert!(attrs.contains("Secure"), "{attrs}");
}

async fn session_forms_from_other_origins_are_refused(db: Db) {
    let srv = TestServer::start(db).await;
    let http = no_redirects();
    let (task, _) = srv.create_open_task("Feed the cat.").await;
    let (_, token) = srv.register_worker("Ada").await;
    let (pre, csrf) = login_page(&srv, &http).await;
    // Signing in from another site is refused, token or not.
    let refused = post_login(
        &srv,
        &http,
        (&pre, &csrf),
        &token,
        &[("sec-fetch-site", "cross-site")],
    )
    .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let session = sign_in_with(
        &srv,
        &http,
        (&pre, &csrf),
        &token,
        &same_origin(&srv.base_url),
    )
    .await;
    let page = get_with(&http, &srv.url(&format!("/app/tasks/{task}")), &session).await;
    let csrf = csrf_of(&page.text().await.expect("page"));
    let claim = srv.url(&format!("/app/tasks/{task}/claim"));
    for (name, value) in [
        ("origin", "http://evil.example".to_owned()),
        // Another port of the same host is another origin.
        ("origin", srv.base_url.replace("127.0.0.1:", "127.0.0.1:1")),
        ("sec-fetch-site", "same-site".to_owned()),
    ] {
        let res = post_form(
            &http,
            &claim,
            &session,
            &[(name, value.as_str())],
            &[("csrf", csrf.as_str())],
        )
        .await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{name}: {value}");
    }
    let task_json = srv.store.task(task).await.unwrap().unwrap();
    assert_eq!(
        task_json.state,
        meatspace_domain::TaskState::Open,
        "not claimed"
    );
    let res = post_form(
        &http,
        &claim,
        &session,
        &same_origin(&srv.base_url),
        &[("csrf", csrf.as_str())],
    )
    .await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
}

async fn invites_need_the_dev_key_and_a_valid_lifetime(db: Db) {
    let srv = TestServer::start(db).await;
    srv.post("/api/v1/workers/invites")
        .expect_problem(StatusCode::UNAUTHORIZED)
        .await;
    for bad in [
        json!({ "expires_in_seconds": 10 }),
        json!({ "expires_in_seconds": 99_999_999 }),
        json!({ "other": 1 }),
    ] {
        srv.dev(Method::POST, "/api/v1/workers/invites")
            .json(&bad)
            .expect_problem(StatusCode::UNPROCESSABLE_ENTITY)
            .await;
    }
    srv.dev(Method::POST, "/api/v1/workers/invites")
        .header(CONTENT_TYPE, "application/json")
        .body("{")
        .expect_problem(StatusCode::BAD_REQUEST)
        .await;
    let body = srv
        .dev(Method::POST, "/api/v1/workers/invites")
        .json(&json!({ "expires_in_seconds": 3600 }))
        .expect_json(StatusCode::CREATED)
        .await;
    let url = str_at(&body, "/invite_url");
    assert!(
        url.starts_with(&format!("{}/app/invite/msi_", srv.base_url)),
        "{url}"
    );
    let expires: chrono::DateTime<chrono::Utc> =
        str_at(&body, "/expires_at").parse().expect("a timestamp");
    let left = expires - chrono::Utc::now();
    assert!(
        left > chrono::TimeDelta::minutes(55) && left <= chrono::TimeDelta::hours(1),
        "{left}"
    );
    // Behind a TLS-terminating proxy the link is https.
    let body = srv
        .dev(Method::POST, "/api/v1/workers/invites")
        .header("x-forwarded-proto", "https")
        .expect_json(StatusCode::CREATED)
        .await;
    assert!(str_at(&body, "/invite_url").starts_with("https://"));
}

async fn an_invite_signs_a_person_in_once(db: Db) {
    let srv = TestServer::start(db).await;
    let http = no_redirects();
    let url = create_invite(&srv).await;

    let page = http.get(&url).send().await.expect("invite page");
    assert_eq!(page.status(), StatusCode::OK);
    let csp = header_str(&page, "content-security-policy").expect("a CSP");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert_eq!(
        header_str(&page, "referrer-policy").as_deref(),
        Some("no-referrer")
    );
    let (pre, attrs) = cookie_pair(&page, "ms_presession").expect("a pre-session cookie");
    assert!(
        attrs.contains("HttpOnly") && attrs.contains("SameSite=Lax"),
        "{attrs}"
    );
    let csrf = csrf_of(&page.text().await.expect("page"));

    // Without the token: refused, and nobody is registered.
    let refused = post_form(&http, &url, &pre, &[], &[("name", "Mallory")]).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(srv.counts().await.workers, 0);

    // A form from another origin is refused even with the right token.
    for (name, value) in [
        ("origin", "http://evil.example"),
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
    ] {
        let refused = post_form(
            &http,
            &url,
            &pre,
            &[(name, value)],
            &[("csrf", csrf.as_str()), ("name", "Mallory")],
        )
        .await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{name}: {value}");
    }
    assert_eq!(srv.counts().await.workers, 0);

    // Behind TLS (on loopback without a public URL, a proxy's
    // X-Forwarded-Proto says so), the pre-session cookie is `__Host-`
    // prefixed and the session cookie Secure; HttpOnly and SameSite always.
    let tls_page = http
        .get(&url)
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .expect("invite page");
    let (pre, attrs) =
        cookie_pair(&tls_page, "__Host-ms_presession").expect("a __Host- pre-session cookie");
    for attr in ["Secure", "Path=/;", "HttpOnly"] {
        assert!(attrs.contains(attr), "{attr} missing: {attrs}");
    }
    let csrf = csrf_of(&tls_page.text().await.expect("page"));
    let tls_origin = format!("https://{}", srv.base_url.trim_start_matches("http://"));
    let [origin, fetch_site] = same_origin(&tls_origin);
    let joined = post_form(
        &http,
        &url,
        &pre,
        &[("x-forwarded-proto", "https"), origin, fetch_site],
        &[("csrf", csrf.as_str()), ("name", "Grace")],
    )
    .await;
    assert_eq!(joined.status(), StatusCode::SEE_OTHER);
    assert_eq!(header_str(&joined, LOCATION).as_deref(), Some("/app/tasks"));
    let (session, attrs) = cookie_pair(&joined, "ms_session").expect("a session cookie");
    for attr in ["HttpOnly", "SameSite=Lax", "Secure", "Path=/app"] {
        assert!(attrs.contains(attr), "{attr} missing: {attrs}");
    }
    assert_eq!(srv.counts().await.workers, 1);
    let tasks = get_with(&http, &srv.url("/app/tasks"), &session).await;
    assert_eq!(tasks.status(), StatusCode::OK);
    assert!(tasks.text().await.expect("page").contains("Grace"));

    // Once only.
    let again = http.get(&url).send().await.expect("invite page");
    assert_eq!(again.status(), StatusCode::GONE);
    let again = post_form(
        &http,
        &url,
        &pre,
        &[("x-forwarded-proto", "https")],
        &[("csrf", csrf.as_str()), ("name", "Eve")],
    )
    .await;
    assert_eq!(again.status(), StatusCode::GONE);
    assert_eq!(srv.counts().await.workers, 1);
    // A made-up code is no invite either.
    let fake = http
        .get(srv.url("/app/invite/msi_nothing_here"))
        .send()
        .await
        .expect("page");
    assert_eq!(fake.status(), StatusCode::GONE);
}

/// A revoked link answers as a used one does: 410 and no form, for the page
/// as for its submission.
async fn a_revoked_invite_link_shows_no_form(db: Db) {
    let srv = TestServer::start(db).await;
    let http = no_redirects();
    let created = srv
        .dev(Method::POST, "/api/v1/workers/invites")
        .expect_json(StatusCode::CREATED)
        .await;
    let url = str_at(&created, "/invite_url");
    let id = str_at(&created, "/id");
    let page = http.get(&url).send().await.expect("invite page");
    assert_eq!(page.status(), StatusCode::OK, "a fresh link shows its form");
    let pre = cookie_pair(&page, "ms_presession")
        .expect("a pre-session cookie")
        .0;
    let csrf = csrf_of(&page.text().await.expect("page"));

    srv.dev(
        Method::POST,
        &format!("/api/v1/workers/invites/{id}/revoke"),
    )
    .expect_json(StatusCode::OK)
    .await;

    let page = http.get(&url).send().await.expect("invite page");
    assert_eq!(page.status(), StatusCode::GONE);
    let text = page.text().await.expect("page");
    assert!(text.contains("revoked"), "the page says why: {text}");
    assert!(!text.contains("name=\"name\""), "no sign-up form: {text}");
    // A submission that passes the session and origin checks (the form was
    // fetched before the revocation): refused for the revocation.
    let post = post_form(
        &http,
        &url,
        &pre,
        &same_origin(&srv.base_url),
        &[("csrf", csrf.as_str()), ("name", "Eve")],
    )
    .await;
    assert_eq!(post.status(), StatusCode::GONE);
    assert_eq!(srv.counts().await.workers, 0);
}

async fn pages_need_a_session_and_forms_their_token(db: Db) {
    let srv = TestServer::start(db).await;
    let http = no_redirects();
    let (task, agent_token) = srv
        .create_open_task("Check the bakery's opening hours.")
        .await;
    for path in ["/app/tasks", "/app/my", &format!("/app/tasks/{task}")] {
        let res = http.get(srv.url(path)).send().await.expect("page");
        assert_eq!(res.status(), StatusCode::SEE_OTHER, "{path}");
        assert_eq!(
            header_str(&res, LOCATION).as_deref(),
            Some("/app/login"),
            "{path}"
        );
    }
    let res = http
        .post(srv.url(&format!("/app/tasks/{task}/claim")))
        .form(&[("csrf", "x")])
        .send()
        .await
        .expect("post");
    // Without a session: off to the login page, and nobody claimed it.
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(header_str(&res, LOCATION).as_deref(), Some("/app/login"));
    assert_eq!(srv.task(task, &agent_token).await["state"], "open");

    // Sign in with a worker token; a wrong one is a human error, not a 500.
    let (_, token) = srv.register_worker("Ada").await;
    let (pre, csrf) = login_page(&srv, &http).await;
    let wrong = post_login(&srv, &http, (&pre, &csrf), "msw_wrong", &[]).await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(is_html(&wrong));
    assert!(wrong.text().await.expect("page").contains("not valid"));
    let session = sign_in_with(&srv, &http, (&pre, &csrf), &token, &[]).await;

    // Another session's (or the pre-session's) token does not pass.
    let claim = srv.url(&format!("/app/tasks/{task}/claim"));
    let res = post_form(&http, &claim, &session, &[], &[("csrf", csrf.as_str())]).await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    let page = get_with(&http, &srv.url(&format!("/app/tasks/{task}")), &session).await;
    let token = csrf_of(&page.text().await.expect("page"));
    let res = post_form(&http, &claim, &session, &[], &[("csrf", token.as_str())]).await;
    assert_eq!(res.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        header_str(&res, LOCATION),
        Some(format!("/app/tasks/{task}"))
    );
    assert_eq!(srv.task(task, &agent_token).await["state"], "assigned");

    // The live feed answers JSON in words for the session's own task.
    let feed = get_with(
        &http,
        &srv.url(&format!("/app/tasks/{task}/feed?after=0")),
        &session,
    )
    .await;
    assert_eq!(feed.status(), StatusCode::OK);
    let feed: serde_json::Value = feed.json().await.expect("JSON");
    assert_eq!(feed["task_state"], "assigned");
    assert_eq!(feed["items"][1]["text"], "You claimed the task.");
    // An unknown task page is a human 404 page.
    let res = get_with(&http, &srv.url("/app/tasks/not-a-task"), &session).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert!(is_html(&res));
}

async fn the_pages_live_feed_takes_a_capped_place(db: Db) {
    // One waiting place per credential: while the task page's live feed
    // waits, a second wait of the same worker is refused with the API's
    // 429; the place is given back with the answer.
    let srv = TestServer::start_configured(db, |o| {
        o.rate_limit = meatspace_api::http::rate_limit::RateLimitSettings {
            max_streams_per_credential: std::num::NonZeroU32::new(1),
            max_streams_per_address: std::num::NonZeroU32::new(10),
            ..meatspace_api::http::rate_limit::RateLimitSettings::OFF
        }
    })
    .await;
    let http = no_redirects();
    let (task, agent_token) = srv.create_open_task("Water the plants.").await;
    let (_, token) = srv.register_worker("Ada").await;
    srv.worker_post(task, &token, "claim").await;
    let (pre, csrf) = login_page(&srv, &http).await;
    let session = sign_in_with(&srv, &http, (&pre, &csrf), &token, &[]).await;
    let last = srv
        .feed(task, &agent_token)
        .await
        .last()
        .and_then(|e| e["id"].as_i64())
        .expect("the task's events");
    let feed_url = srv.url(&format!("/app/tasks/{task}/feed?after={last}"));
    let first = get_with(&http, &feed_url, &session);
    let second = async {
        srv.until_waiting(1).await;
        let refused = get_with(&http, &feed_url, &session).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let body: serde_json::Value = refused.json().await.expect("problem");
        assert!(
            str_at(&body, "/type").ends_with("/too-many-streams"),
            "{body}"
        );
        // The agent cancels: the first wait answers.
        srv.agent_post(task, &agent_token, "cancel").await;
    };
    let (first, ()) = tokio::join!(first, second);
    assert_eq!(first.status(), StatusCode::OK);
    let page: serde_json::Value = first.json().await.expect("feed page");
    assert_eq!(page["terminal"], true, "{page}");
    // Its place is free again: a read of the ended task answers at once.
    let again = get_with(&http, &feed_url, &session).await;
    assert_eq!(again.status(), StatusCode::OK);
}

/// The result form shows the worker's photos of its assignment; the route
/// that serves them answers only the worker who sent them, on the task it
/// holds: not another worker, not without a session, not a photo of another
/// task.
async fn a_worker_sees_only_its_own_assignments_photos(db: Db) {
    let srv = TestServer::start(db).await;
    let http = no_redirects();
    let mine = srv.active_task("Photograph the gate").await;
    let theirs = srv.active_task("Photograph the fence").await;
    let upload = |t: &meatspace_tests::server::ActiveTask| {
        srv.worker(&t.worker_token)
            .post(&format!("/api/v1/worker/tasks/{}/photos", t.task_id))
            .header(CONTENT_TYPE, "image/png")
            .body(meatspace_tests::server::images::png(8, 6))
            .expect_json(StatusCode::OK)
    };
    let my_photo = str_at(&upload(&mine).await, "/events/0/data/photo_id");
    let their_photo = str_at(&upload(&theirs).await, "/events/0/data/photo_id");
    let path = |task, photo: &str| srv.url(&format!("/app/tasks/{task}/photos/{photo}"));

    let session = sign_in(&srv, &http, &mine.worker_token, &[]).await;
    let res = get_with(&http, &path(mine.task_id, &my_photo), &session).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(header_str(&res, CONTENT_TYPE).as_deref(), Some("image/png"));
    for (task, photo) in [
        (theirs.task_id, their_photo.as_str()),
        (mine.task_id, their_photo.as_str()),
        (theirs.task_id, my_photo.as_str()),
    ] {
        let res = get_with(&http, &path(task, photo), &session).await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{task} {photo}");
    }
    let res = get_with(
        &http,
        &srv.url(&format!("/app/tasks/{}/photos/x", mine.task_id)),
        &session,
    )
    .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    let res = http
        .get(path(mine.task_id, &my_photo))
        .send()
        .await
        .expect("get");
    assert_eq!(
        res.status(),
        StatusCode::SEE_OTHER,
        "no session: to the sign-in page"
    );
}

/// The app lists a worker's qualifications on its tasks page, shows it only
/// the open tasks whose requirements it meets, and a task it may not take
/// is a 404 page, as the API answers.
async fn the_app_shows_a_workers_qualifications_and_only_tasks_for_it(db: Db) {
    let srv = TestServer::start(db).await;
    let http = no_redirects();
    let (worker, token) = srv.register_worker("Ada").await;
    srv.dev(
        Method::PUT,
        &format!("/api/v1/workers/{worker}/qualifications/vehicle"),
    )
    .json(&json!({ "value": "bike" }))
    .expect_json(StatusCode::OK)
    .await;
    let created = srv
        .create_task_with(json!({
            "description": "Deliver by car",
            "requirements": [{ "qualification": "vehicle", "equals": "car" }],
        }))
        .await;
    let (by_car, car_token) = (
        meatspace_tests::server::uuid_at(&created, "/task/id"),
        str_at(&created, "/agent_token"),
    );
    srv.publish(by_car, &car_token).await;
    srv.create_open_task("Deliver by bike").await;

    let session = sign_in(&srv, &http, &token, &[]).await;
    let mine = get_with(&http, &srv.url("/app/my"), &session).await;
    assert!(mine.text().await.expect("page").contains("vehicle: bike"));
    let open = get_with(&http, &srv.url("/app/tasks"), &session)
        .await
        .text()
        .await
        .expect("page");
    assert!(open.contains("Deliver by bike"), "{open}");
    assert!(!open.contains("Deliver by car"), "{open}");
    let page = get_with(&http, &srv.url(&format!("/app/tasks/{by_car}")), &session).await;
    assert_eq!(page.status(), StatusCode::NOT_FOUND);
}
