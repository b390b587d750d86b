//! Notifications, through the real server and the controller on both
//! backends, to a real SMTP server (aiosmtpd) and a push service of the
//! test's own that checks each message's VAPID signature and decrypts it
//! with the subscription's private key:
//!
//! - a published task is announced to exactly the workers who asked for
//!   new tasks, whose area holds it, who meet its requirements and whom
//!   its owner has not blocked, once each, by push and by email;
//! - the email has a plain and an HTML part (worker-visible text escaped),
//!   a link to the task and a working unsubscribe link (no sign-in), also
//!   in `List-Unsubscribe`;
//! - news of a task reaches its holder; the hourly cap drops the excess;
//! - a subscription the push service calls gone is removed;
//! - a fan-out interrupted by a controller crash resumes without sending
//!   anyone a notification twice.

mod controller_support;

use std::time::Duration;

use controller_support::InProcess;
use meatspace_controller::ControllerConfig;
use meatspace_controller::notify::{NotifySettings, SmtpSettings, SmtpTls};
use meatspace_domain::notify::Channel;
use meatspace_tests::push::{PushService, Subscription};
use meatspace_tests::server::{Expect, TestServer, task_and_token};
use meatspace_tests::smtp::SmtpServer;
use meatspace_tests::{Db, eventually};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

meatspace_tests::api_tests!(
    threads = 2;
    a_published_task_reaches_exactly_the_workers_who_may_take_it,
    news_of_a_task_reaches_its_holder_within_the_hourly_cap,
    a_subscription_the_push_service_calls_gone_is_removed,
    a_fan_out_interrupted_by_a_crash_sends_each_worker_one_message,
    a_worker_is_warned_once_before_its_assignment_lapses,
);

/// Alexanderplatz, Berlin: where the tasks are.
const HERE: (f64, f64) = (52.5219, 13.4132);

struct System {
    srv: TestServer,
    smtp: SmtpServer,
    push: PushService,
}

async fn system(db: Db) -> System {
    system_on(TestServer::start(db).await).await
}

async fn system_on(srv: TestServer) -> System {
    // The controller runs in this process: its warnings (a failed send)
    // are printed with a failing test's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn,tower_http=off")
        .with_test_writer()
        .try_init();
    let smtp = SmtpServer::start().await;
    let push = PushService::start(&srv.options.integrations.vapid_public_key).await;
    System { srv, smtp, push }
}

impl System {
    /// A controller sending to this system's SMTP server and push service,
    /// with `cap` notifications per worker and hour.
    fn controller(&self, cap: u32) -> InProcess {
        let notify = NotifySettings {
            smtp: Some(SmtpSettings {
                host: "127.0.0.1".into(),
                port: self.smtp.port,
                tls: SmtpTls::None,
                username: None,
                password: None,
                from: "meatspace <notify@meatspace.test>".into(),
            }),
            hourly_cap: cap,
            retry_base: Duration::from_millis(50),
            retry_max: Duration::from_millis(200),
            push_allow: "127.0.0.0/8".parse().expect("allow loopback"),
            links_origin: self.srv.base_url.clone(),
            server_key: Some(self.srv.options.integrations.server_key.clone()),
            ..NotifySettings::default()
        };
        InProcess::start(
            &self.srv.store,
            ControllerConfig {
                notify,
                clock: self.srv.options.clock.clone(),
                ..controller_support::config()
            },
        )
    }

    /// Ada, told by email of the tasks she holds and of no new ones;
    /// returns her token.
    async fn ada_on_her_own_tasks(&self) -> String {
        let mut mine_only = prefs(0.0, 5, Some("ada@example.org"));
        mine_only["new_tasks"] = json!(false);
        self.worker("Ada", mine_only, false).await.1
    }

    /// A worker with these preferences (and a push subscription when
    /// `push`); returns its id, token and subscription.
    async fn worker(
        &self,
        name: &str,
        prefs: Value,
        push: bool,
    ) -> (Uuid, String, Option<Subscription>) {
        let (id, token) = self.srv.register_worker(name).await;
        self.srv
            .worker(&token)
            .request(Method::PUT, "/api/v1/worker/preferences")
            .json(&prefs)
            .expect_json(StatusCode::OK)
            .await;
        let subscription = if push {
            let s = self.push.subscribe();
            let answer = self
                .srv
                .worker(&token)
                .post_json("/api/v1/worker/push-subscriptions", &s.json())
                .await;
            assert_eq!(answer["subscribed"], true);
            Some(s)
        } else {
            None
        };
        (id, token, subscription)
    }

    /// Waits until the outbox is empty: every cause fanned out, every
    /// notification done (sent, dropped or failed). 60 s at most.
    async fn settled(&self) {
        let store = &self.srv.store;
        eventually(Duration::from_secs(60), "an empty outbox", || async move {
            let backlog = store.notification_backlog().await.expect("the backlog");
            (backlog.causes == 0 && backlog.notifications == 0).then_some(())
        })
        .await;
    }

    /// Creates and publishes a task at `HERE` with `extra` fields.
    async fn publish(&self, description: &str, extra: Value) -> (Uuid, String) {
        let mut body = json!({
            "description": description,
            "location": { "latitude": HERE.0, "longitude": HERE.1, "radius_m": 100 },
        });
        for (k, v) in extra.as_object().expect("fields") {
            body[k] = v.clone();
        }
        let created = self.srv.create_task_with(body).await;
        let (id, token) = task_and_token(&created);
        self.srv.publish(id, &token).await;
        (id, token)
    }
}

/// Preferences: new tasks within `km` of a point `north` degrees north of
/// `HERE`, and email to `email` if any.
fn prefs(north: f64, km: u32, email: Option<&str>) -> Value {
    json!({
        "area": { "latitude": HERE.0 + north, "longitude": HERE.1, "radius_m": km * 1000 },
        "new_tasks": true,
        "my_tasks": true,
        "email": email,
    })
}

async fn a_published_task_reaches_exactly_the_workers_who_may_take_it(db: Db) {
    let sys = system(db).await;
    let srv = &sys.srv;
    // Ada qualifies, in her area, by push and email. Bea is in her area but
    // without the qualification; Cem is 11 km away with a 5 km area; Dan is
    // blocked by the task's owner; Eve asked for no new tasks.
    let (ada, _, ada_push) = sys
        .worker("Ada", prefs(0.01, 5, Some("ada@example.org")), true)
        .await;
    let (_, _, bea_push) = sys
        .worker("Bea", prefs(0.0, 5, Some("bea@example.org")), true)
        .await;
    let (_, _, cem_push) = sys
        .worker("Cem", prefs(0.1, 5, Some("cem@example.org")), true)
        .await;
    let (dan, _, dan_push) = sys
        .worker("Dan", prefs(0.0, 5, Some("dan@example.org")), true)
        .await;
    let mut quiet = prefs(0.0, 5, Some("eve@example.org"));
    quiet["new_tasks"] = json!(false);
    let (eve, _, eve_push) = sys.worker("Eve", quiet, true).await;
    for worker in [ada, dan, eve] {
        srv.dev(
            Method::PUT,
            &format!("/api/v1/workers/{worker}/qualifications/vehicle"),
        )
        .json(&json!({}))
        .expect_json(StatusCode::OK)
        .await;
    }
    let listeners = srv.store.listeners(None, 10).await.unwrap();
    assert_eq!(
        listeners.len(),
        4,
        "Eve, who asked for no new tasks, is no listener"
    );
    srv.dev(Method::PUT, &format!("/api/v1/blocks/{dan}"))
        .json(&json!({}))
        .expect_json(StatusCode::OK)
        .await;

    let controller = sys.controller(20);
    let (task, _) = sys
        .publish(
            "Check that the <b>gate</b> is locked & photograph it",
            json!({ "requirements": [{ "qualification": "vehicle" }] }),
        )
        .await;
    sys.settled().await;

    // Push: Ada only, decrypted and signed as it must be.
    assert_eq!(sys.push.refused(), Vec::<String>::new());
    let got = sys.push.received(ada_push.as_ref().unwrap());
    assert_eq!(got.len(), 1, "Ada gets one push: {got:?}");
    assert_eq!(got[0]["title"], "A new task near you");
    assert_eq!(
        got[0]["body"], "Check that the <b>gate</b> is locked & photograph it",
        "push payloads are JSON data: the worker app shows them as text"
    );
    assert_eq!(got[0]["url"], format!("{}/app/tasks/{task}", srv.base_url));
    for other in [&bea_push, &cem_push, &dan_push, &eve_push] {
        assert!(sys.push.received(other.as_ref().unwrap()).is_empty());
    }

    // Email: Ada only, text and escaped HTML, with working links.
    let mail = sys.smtp.messages();
    assert_eq!(mail.len(), 1, "one email: {mail:?}");
    let m = &mail[0];
    assert_eq!(m.to, "ada@example.org");
    assert_eq!(m.subject, "A new task near you");
    assert!(
        m.text
            .contains("Check that the <b>gate</b> is locked & photograph it")
    );
    assert!(
        m.html
            .contains("Check that the &#60;b&#62;gate&#60;/b&#62; is locked &#38; photograph it"),
        "HTML escapes the task's text: {}",
        m.html
    );
    assert!(!m.html.contains("<b>gate"));
    assert!(
        m.text
            .contains(&format!("{}/app/tasks/{task}", srv.base_url))
    );
    let unsubscribe = m
        .header("List-Unsubscribe")
        .expect("List-Unsubscribe")
        .trim_matches(|c| c == '<' || c == '>')
        .to_owned();
    assert_eq!(
        m.header("List-Unsubscribe-Post"),
        Some("List-Unsubscribe=One-Click")
    );
    assert!(m.text.contains(&unsubscribe), "the link is in the body too");

    // The link works without signing in: a GET asks, the POST unsubscribes.
    let page = srv.client.get(&unsubscribe).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("Stop email?"));
    let prefs_before = srv.store.preferences(ada).await.unwrap().unwrap();
    assert_eq!(prefs_before.email.as_deref(), Some("ada@example.org"));
    let done = srv.client.post(&unsubscribe).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::OK);
    assert!(done.text().await.unwrap().contains("no more email"));
    assert_eq!(
        srv.store.preferences(ada).await.unwrap().unwrap().email,
        None
    );
    // A forged token is refused and changes nothing.
    let forged = unsubscribe.replace("channel=email", "channel=push");
    let refused = srv.client.post(&forged).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
    assert!(!srv.store.push_subscriptions(ada).await.unwrap().is_empty());

    controller.stop().await;
}

async fn news_of_a_task_reaches_its_holder_within_the_hourly_cap(db: Db) {
    let sys = system(db).await;
    let srv = &sys.srv;
    let token = sys.ada_on_her_own_tasks().await;
    let controller = sys.controller(2);
    let (task, agent) = sys.publish("Water the plants", json!({})).await;
    srv.worker_post(task, &token, "claim").await;
    srv.worker(&token)
        .post_json(&format!("/api/v1/worker/tasks/{task}/start"), &json!({}))
        .await;
    // Two issues answered: two emails; the third news (the cancel) is over
    // the cap of two an hour and dropped.
    for n in 0..2 {
        let issue = srv
            .raise_issue(
                task,
                &token,
                "unclear_instructions",
                &format!("Which plant first? ({n})"),
            )
            .await;
        srv.clarify(task, &agent, issue, "The fern")
            .expect_json(StatusCode::OK)
            .await;
        sys.settled().await;
    }
    srv.agent_post(task, &agent, "cancel").await;
    sys.settled().await;
    let mail = sys.smtp.messages();
    let subjects: Vec<&str> = mail.iter().map(|m| m.subject.as_str()).collect();
    assert_eq!(
        subjects,
        ["Your issue was answered", "Your issue was answered"]
    );
    assert!(
        !mail[0].text.contains("The fern"),
        "the agent's answer stays in the app"
    );
    let (worker, _) = (srv.store.workers(None, 1).await.unwrap()[0].id, ());
    let hour_ago = srv.now() - chrono::TimeDelta::hours(1);
    assert_eq!(
        srv.store
            .sent_since(worker, Channel::Email, hour_ago)
            .await
            .unwrap(),
        2
    );
    // The process's recorder counts the drop (the suites of this binary
    // share it, and no other drops anything).
    let text = srv.metrics().send().await.unwrap().text().await.unwrap();
    let dropped = meatspace_tests::prometheus::counter(
        &text,
        "meatspace_notifications_total",
        &[("channel", "email"), ("outcome", "dropped_by_cap")],
    );
    assert!(dropped >= 1.0, "the dropped email is counted ({dropped})");
    controller.stop().await;
}

async fn a_subscription_the_push_service_calls_gone_is_removed(db: Db) {
    let sys = system(db).await;
    let (ada, _, sub) = sys.worker("Ada", prefs(0.0, 5, None), true).await;
    let sub = sub.unwrap();
    sys.push.answer(&sub, StatusCode::GONE);
    let controller = sys.controller(20);
    sys.publish("Count the bicycles", json!({})).await;
    sys.settled().await;
    assert!(
        sys.srv
            .store
            .push_subscriptions(ada)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(sys.push.received(&sub).is_empty());
    controller.stop().await;
}

/// More workers than one page of the fan-out (1000), told by push only.
async fn many_listeners(sys: &System) -> Vec<Subscription> {
    let mut subs = Vec::new();
    for n in 0..1300 {
        let (_, _, sub) = sys
            .worker(&format!("W{n}"), prefs(0.0, 5, None), true)
            .await;
        subs.push(sub.unwrap());
    }
    subs
}

/// Waits for the first push: the fan-out or the sending is under way.
async fn first_push(sys: &System) {
    eventually(Duration::from_secs(60), "a first push", || async {
        (sys.push.total() > 0).then_some(())
    })
    .await;
}

/// Every worker was told, each under one notification id.
fn each_told_once(sys: &System, subs: &[Subscription]) {
    assert_eq!(sys.push.refused(), Vec::<String>::new());
    // Delivery is at least once: a message sent but not yet recorded when
    // the controller died is sent again, with the same id (the service
    // worker shows one notification per id). Each worker has one.
    let mut ids = std::collections::HashSet::new();
    for s in subs {
        let got = sys.push.received(s);
        assert!(!got.is_empty(), "every worker is told");
        let mine: std::collections::HashSet<i64> = got
            .iter()
            .map(|m| m["id"].as_i64().expect("an id"))
            .collect();
        assert_eq!(mine.len(), 1, "one notification per worker: {got:?}");
        ids.extend(mine);
    }
    assert_eq!(ids.len(), subs.len());
}

async fn a_fan_out_interrupted_by_a_crash_sends_each_worker_one_message(db: Db) {
    let sys = system(db).await;
    let subs = many_listeners(&sys).await;
    let first = sys.controller(20);
    sys.publish("Read the water meter", json!({})).await;
    first_push(&sys).await;
    first.crash().await;
    // The crashed controller's leases run out (a minute on its clock).
    sys.srv.advance_clock(chrono::TimeDelta::seconds(61));
    let second = sys.controller(20);
    sys.settled().await;
    each_told_once(&sys, &subs);
    second.stop().await;
}

/// The fault suite's case: PostgreSQL is killed in the middle of a
/// fan-out and started again; the controller rides it out and every
/// worker is still told, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_crash_during_a_fan_out_loses_no_notification() {
    let pg = tokio::task::spawn_blocking(meatspace_tests::pg::PgServer::start_new)
        .await
        .unwrap();
    let db = meatspace_tests::TestDb::postgres_on(&pg.admin_url).await;
    let srv = TestServer::start_on(Db::Postgres, db, Default::default()).await;
    let sys = system_on(srv).await;
    let subs = many_listeners(&sys).await;
    let controller = sys.controller(20);
    sys.publish("Read the gas meter", json!({})).await;
    first_push(&sys).await;
    tokio::task::block_in_place(|| pg.crash());
    tokio::task::block_in_place(|| pg.restart_after_crash());
    // Claims made before the crash may be held by leases; they run out a
    // minute later on the controller's clock.
    sys.srv.advance_clock(chrono::TimeDelta::seconds(61));
    sys.settled().await;
    each_told_once(&sys, &subs);
    controller.stop().await;
}

/// The holder of an assignment is warned before its start deadline
/// passes, once per deadline however often the controller looks.
async fn a_worker_is_warned_once_before_its_assignment_lapses(db: Db) {
    let sys = system(db).await;
    let srv = &sys.srv;
    let token = sys.ada_on_her_own_tasks().await;
    let controller = sys.controller(20);
    let (task, _) = sys.publish("Feed the cat", json!({})).await;
    let claimed = srv.worker_post(task, &token, "claim").await;
    let start_by: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(claimed["task"]["start_by"].clone()).expect("start_by");
    // Ten minutes before the deadline (the notice is fifteen).
    srv.advance_clock_past(start_by - chrono::TimeDelta::minutes(10));
    eventually(Duration::from_secs(60), "a lapse warning", || async {
        (!sys.smtp.messages().is_empty()).then_some(())
    })
    .await;
    // A minute on, the controller looks again: the same deadline is not
    // warned of twice.
    srv.advance_clock(chrono::TimeDelta::minutes(1));
    sys.settled().await;
    let subjects: Vec<String> = sys.smtp.messages().into_iter().map(|m| m.subject).collect();
    assert_eq!(subjects, ["Your task is about to lapse"]);
    controller.stop().await;
}
