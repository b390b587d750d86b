//! What a worker is told, and when: the worker's area and preferences,
//! the causes of a notification, and who hears of each.
//!
//! Causes are events the store records in its notification outbox in the
//! transaction that appends them ([`Cause::of_event`] says which), plus
//! one the controller finds from the tasks table (an assignment about to
//! lapse). Who hears of a cause is decided here: a published task is
//! announced to the workers who asked for new tasks, whose area holds the
//! task's place, who meet its requirements and whom its owner has not
//! blocked ([`announce_to`]); everything else goes to the worker holding
//! the task, if it asked to hear about its own tasks.

use serde::{Deserialize, Serialize};

use crate::place::{self, Location};
use crate::{Actor, EventType, Task, TaskState};

/// Longest email address accepted (RFC 5321's path limit).
pub const MAX_EMAIL_CHARS: usize = 254;
/// Largest area a worker may set, in metres around its point.
pub const MAX_AREA_M: u32 = 200_000;
/// Most notifications a worker is sent per hour on each channel, unless
/// configured otherwise; more are dropped (and counted).
pub const DEFAULT_HOURLY_CAP: u32 = 20;
/// Characters of a task's description a notification quotes.
pub const QUOTED_CHARS: usize = 140;

/// Where a worker works: a point and a distance around it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Area {
    /// WGS 84 latitude in degrees, -90 to 90.
    pub latitude: f64,
    /// WGS 84 longitude in degrees, -180 to 180.
    pub longitude: f64,
    /// Metres around the point (1 to 200000).
    pub radius_m: u32,
}

impl Area {
    /// Whether a task at `location` is in the area: its site (the point and
    /// its radius) reaches into the area's circle.
    pub fn holds(&self, location: &Location) -> bool {
        place::distance_m(
            self.latitude,
            self.longitude,
            location.latitude,
            location.longitude,
        ) <= f64::from(self.radius_m) + f64::from(location.radius_m)
    }
}

/// What a worker wants to be told, and where. Everything is off until the
/// worker turns it on, except news of its own tasks, which goes wherever
/// the worker can be reached.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Preferences {
    /// Where the worker works. Newly published tasks are announced when
    /// their place is in this area; without an area, only tasks without a
    /// place are.
    pub area: Option<Area>,
    /// Announce newly published tasks the worker may take.
    #[serde(default)]
    pub new_tasks: bool,
    /// Tell the worker about its own tasks: an answer to its issue, a
    /// revision request, the review's outcome, an assignment about to
    /// lapse.
    #[serde(default = "yes")]
    pub my_tasks: bool,
    /// Where email goes; none: no email.
    pub email: Option<String>,
}

fn yes() -> bool {
    true
}

impl Default for Preferences {
    fn default() -> Self {
        Preferences {
            area: None,
            new_tasks: false,
            my_tasks: true,
            email: None,
        }
    }
}

/// Why preferences were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreferenceError {
    #[error("area: {0}")]
    Area(String),
    #[error(
        "email: not an address (one @ between a local part and a domain, no spaces, \
         at most {MAX_EMAIL_CHARS} characters)"
    )]
    Email,
}

impl Preferences {
    /// The preferences, checked: a real point and a distance in bounds, an
    /// email address of plausible form (trimmed).
    pub fn checked(mut self) -> Result<Self, PreferenceError> {
        if let Some(area) = &self.area {
            place::Position::new(area.latitude, area.longitude, 0.0)
                .map_err(|e| PreferenceError::Area(e.to_string()))?;
            if !(1..=MAX_AREA_M).contains(&area.radius_m) {
                return Err(PreferenceError::Area(format!(
                    "radius_m must be 1 to {MAX_AREA_M}"
                )));
            }
        }
        if let Some(email) = self.email.take() {
            let email = email.trim().to_owned();
            if !email.is_empty() {
                if !plausible_email(&email) {
                    return Err(PreferenceError::Email);
                }
                self.email = Some(email);
            }
        }
        Ok(self)
    }
}

/// One `@` between a non-empty local part and a dotted domain, no spaces
/// or control characters: what a mail server can be asked to deliver to.
/// Whether the mailbox exists is for the mail server to say.
fn plausible_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    s.chars().count() <= MAX_EMAIL_CHARS
        && !local.is_empty()
        && !domain.contains('@')
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | '"' | ','))
}

/// Where a notification goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// Web Push to the worker app (every browser the worker subscribed).
    Push,
    /// Email over SMTP to the worker's address.
    Email,
}

crate::names! {
    Channel {
        Push => "push",
        Email => "email",
    }
}

/// Why a worker is told something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A task the worker may take was published in its area.
    Published,
    /// The agent answered the worker's issue.
    IssueAnswered,
    /// The agent asked for changes to the worker's submission.
    RevisionRequested,
    /// The worker's submission was accepted (by the agent or automatically).
    Accepted,
    /// The task the worker held was cancelled (a rejected submission, or
    /// the agent's cancel).
    Cancelled,
    /// The worker's assignment lapses soon.
    Lapsing,
}

crate::names! {
    Cause {
        Published => "published",
        IssueAnswered => "issue_answered",
        RevisionRequested => "revision_requested",
        Accepted => "accepted",
        Cancelled => "cancelled",
        Lapsing => "lapsing",
    }
}

impl Cause {
    /// The event types the store records as possible causes (the outbox's
    /// trigger in each backend's migration names the same five).
    pub const EVENT_TYPES: [EventType; 5] = [
        EventType::TaskPublished,
        EventType::AgentIssueResponse,
        EventType::TaskRevisionRequested,
        EventType::TaskCompleted,
        EventType::TaskCancelled,
    ];

    /// The cause an event is, if any: a worker's own complete (no review)
    /// tells the worker nothing it does not know.
    pub fn of_event(kind: EventType, actor: Actor) -> Option<Cause> {
        match kind {
            EventType::TaskPublished => Some(Cause::Published),
            EventType::AgentIssueResponse => Some(Cause::IssueAnswered),
            EventType::TaskRevisionRequested => Some(Cause::RevisionRequested),
            EventType::TaskCompleted if actor != Actor::Worker => Some(Cause::Accepted),
            EventType::TaskCancelled => Some(Cause::Cancelled),
            _ => None,
        }
    }

    /// Whether the cause is news of the worker's own task (else it is an
    /// announcement of a task to take).
    pub fn is_own_task(self) -> bool {
        self != Cause::Published
    }

    /// The key that makes a notification once per worker, cause and
    /// channel: the cause, its task and which occurrence of the cause it
    /// is (the event's id for news of a task, the deadline in
    /// milliseconds for a lapse; an announcement is once per task).
    pub fn key(self, task: uuid::Uuid, occurrence: Option<i64>) -> String {
        match occurrence {
            Some(n) => format!("{}:{task}:{n}", self.as_str()),
            None => format!("{}:{task}", self.as_str()),
        }
    }
}

/// Whether a newly published `task` is announced to a worker with
/// `prefs` (who meets the task's requirements and is not blocked by its
/// owner: the caller checks those against the store).
pub fn announce_to(task: &Task, prefs: &Preferences) -> bool {
    if !prefs.new_tasks || task.state != TaskState::Open {
        return false;
    }
    match (&task.location, &prefs.area) {
        (Some(location), Some(area)) => area.holds(location),
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// Whether news of `cause` on `task` may still be sent to `worker`, at
/// delivery: a task is announced only while it is open, and news of an
/// own task only while the worker holds it or, for an outcome, held it
/// when it ended.
pub fn still_for(cause: Cause, task: &Task, worker: uuid::Uuid) -> bool {
    match cause {
        Cause::Published => task.state == TaskState::Open,
        Cause::IssueAnswered | Cause::RevisionRequested | Cause::Lapsing => {
            task.worker_id == Some(worker) && !task.state.is_terminal()
        }
        Cause::Accepted | Cause::Cancelled => task.worker_id == Some(worker),
    }
}

/// What a notification says: a subject and a line, with no text the
/// recipient could not already read (a published task's description,
/// which a worker who may take it sees in its list, shortened), and a
/// link into the worker app. Escaping is the medium's (the email's HTML
/// part, the push payload's JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub title: String,
    pub body: String,
    /// Path in the worker app, from its root (`/app/...`).
    pub path: String,
}

/// The message of `cause` on `task`.
pub fn message(cause: Cause, task: &Task) -> Message {
    let path = format!("/app/tasks/{}", task.id);
    let (title, body) = match cause {
        Cause::Published => ("A new task near you".to_owned(), quote(&task.description)),
        Cause::IssueAnswered => (
            "Your issue was answered".to_owned(),
            "The agent answered the issue you raised. Open the task to read it.".to_owned(),
        ),
        Cause::RevisionRequested => (
            "Changes asked for".to_owned(),
            "The agent asked for changes to what you sent. Open the task to see what, and \
             send it again."
                .to_owned(),
        ),
        Cause::Accepted => (
            "Your work was accepted".to_owned(),
            "The task is completed. Thank you.".to_owned(),
        ),
        Cause::Cancelled => (
            "A task of yours was cancelled".to_owned(),
            "The agent cancelled the task you held. Open it to see the reason.".to_owned(),
        ),
        Cause::Lapsing => (
            "Your task is about to lapse".to_owned(),
            "The time to do the task you hold runs out soon: finish it, or stop it so \
             someone else can."
                .to_owned(),
        ),
    };
    Message { title, body, path }
}

/// The first [`QUOTED_CHARS`] characters of `text`, on one line.
fn quote(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut out: String = flat.trim().chars().take(QUOTED_CHARS).collect();
    if flat.trim().chars().count() > QUOTED_CHARS {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn located(lat: f64, lon: f64) -> Task {
        let mut task = crate::task::tests::task(TaskState::Open);
        task.location = Some(Location {
            latitude: lat,
            longitude: lon,
            radius_m: 100,
            address: None,
        });
        task
    }

    fn around(lat: f64, lon: f64, radius_m: u32) -> Preferences {
        Preferences {
            area: Some(Area {
                latitude: lat,
                longitude: lon,
                radius_m,
            }),
            new_tasks: true,
            ..Preferences::default()
        }
    }

    #[test]
    fn a_task_is_announced_inside_the_area_only() {
        // Berlin Alexanderplatz, and a point 0.01° north of it.
        let task = located(52.5219, 13.4132);
        assert!(announce_to(&task, &around(52.5319, 13.4132, 1_200)));
        assert!(!announce_to(&task, &around(52.5319, 13.4132, 900)));
        // 0.01° of latitude is 1,112 m: the task's own radius counts, so
        // 1,020 m + 100 m reach it and 1,000 m + 100 m do not.
        assert!(announce_to(&task, &around(52.5319, 13.4132, 1_020)));
        assert!(!announce_to(&task, &around(52.5319, 13.4132, 1_000)));
    }

    #[test]
    fn nothing_is_announced_to_a_worker_who_did_not_ask() {
        let task = located(52.5219, 13.4132);
        let mut prefs = around(52.5219, 13.4132, 1_000);
        prefs.new_tasks = false;
        assert!(!announce_to(&task, &prefs));
        prefs.new_tasks = true;
        prefs.area = None;
        assert!(!announce_to(&task, &prefs), "a placed task needs an area");
        let unplaced = crate::task::tests::task(TaskState::Open);
        assert!(announce_to(&unplaced, &prefs));
    }

    #[test]
    fn only_an_open_task_is_announced() {
        let mut task = located(52.5219, 13.4132);
        task.state = TaskState::Assigned;
        assert!(!announce_to(&task, &around(52.5219, 13.4132, 10)));
        assert!(!still_for(Cause::Published, &task, uuid::Uuid::nil()));
    }

    #[test]
    fn a_misspelt_preference_is_refused_not_ignored() {
        let typo = serde_json::json!({ "new_task": true });
        assert!(serde_json::from_value::<Preferences>(typo).is_err());
    }

    #[test]
    fn preferences_are_checked() {
        let bad_area = around(91.0, 0.0, 10);
        assert!(matches!(bad_area.checked(), Err(PreferenceError::Area(_))));
        let too_far = around(0.0, 0.0, MAX_AREA_M + 1);
        assert!(matches!(too_far.checked(), Err(PreferenceError::Area(_))));
        for bad in [
            "nobody", "a@b", "a b@c.de", "a@@c.de", "<a@c.de>", "a@c.de.",
        ] {
            let prefs = Preferences {
                email: Some(bad.into()),
                ..Preferences::default()
            };
            assert_eq!(prefs.checked(), Err(PreferenceError::Email), "{bad}");
        }
        let ok = Preferences {
            email: Some("  ada@example.org ".into()),
            ..Preferences::default()
        }
        .checked()
        .unwrap();
        assert_eq!(ok.email.as_deref(), Some("ada@example.org"));
        let cleared = Preferences {
            email: Some("   ".into()),
            ..Preferences::default()
        }
        .checked()
        .unwrap();
        assert_eq!(cleared.email, None);
    }

    #[test]
    fn a_worker_completing_its_own_task_is_not_told_so() {
        assert_eq!(
            Cause::of_event(EventType::TaskCompleted, Actor::Worker),
            None
        );
        assert_eq!(
            Cause::of_event(EventType::TaskCompleted, Actor::System),
            Some(Cause::Accepted)
        );
        for kind in Cause::EVENT_TYPES {
            assert!(Cause::of_event(kind, Actor::Agent).is_some(), "{kind:?}");
        }
        for cause in Cause::ALL {
            assert_eq!(Cause::parse(cause.as_str()), Some(cause));
        }
    }

    #[test]
    fn news_of_a_task_goes_to_its_holder_only() {
        let worker = uuid::Uuid::from_u128(7);
        let mut task = located(0.0, 0.0);
        task.state = TaskState::Active;
        task.worker_id = Some(worker);
        assert!(still_for(Cause::RevisionRequested, &task, worker));
        assert!(!still_for(
            Cause::RevisionRequested,
            &task,
            uuid::Uuid::from_u128(8)
        ));
        task.state = TaskState::Completed;
        assert!(still_for(Cause::Accepted, &task, worker));
        assert!(!still_for(Cause::Lapsing, &task, worker));
    }

    #[test]
    fn a_message_quotes_a_short_flat_description() {
        let mut task = located(0.0, 0.0);
        task.description = format!("Check\nthe gate {}", "x".repeat(300));
        let m = message(Cause::Published, &task);
        assert!(!m.body.contains('\n'));
        assert_eq!(m.body.chars().count(), QUOTED_CHARS + 1);
        assert!(m.body.ends_with('…'));
        assert_eq!(m.path, format!("/app/tasks/{}", task.id));
        let answered = message(Cause::IssueAnswered, &task);
        assert!(
            !answered.body.contains("gate"),
            "no task text in own-task news"
        );
    }
}
