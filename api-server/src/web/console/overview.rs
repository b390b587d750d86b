//! The console's overview: tasks by state now, tasks created and
//! completed per hour (a chart the server draws as SVG), the oldest open
//! task.

use askama::Template;
use axum::response::Response;
use chrono::{DateTime, Duration, TimeDelta, Utc};
use meatspace_domain::TaskState;
use meatspace_store::console::HourCount;
use uuid::Uuid;

use super::{Console, Nav};

pub(super) fn router() -> axum::Router<AppState> {
    axum::Router::new().route("/console", axum::routing::get(overview))
}
use crate::AppState;
use crate::web::{AppError, html};

/// One bar pair of the chart, in the SVG's coordinates.
#[derive(Debug, Clone)]
struct Bar {
    x: u32,
    created_y: u32,
    created_h: u32,
    completed_y: u32,
    completed_h: u32,
    label: String,
}

#[derive(Template)]
#[template(path = "console_overview.html")]
struct OverviewPage {
    nav: Option<Nav>,
    counts: Vec<(&'static str, u64)>,
    total: u64,
    oldest: Option<(Uuid, String, String)>,
    bars: Vec<Bar>,
    week_bars: Vec<Bar>,
    week_peak: u64,
    day_created: u64,
    day_completed: u64,
    week_created: u64,
    week_completed: u64,
    peak: u64,
    health: meatspace_store::console::Health,
}

/// Chart geometry: up to 24 slots, each a pair of bars.
const CHART_HEIGHT: u32 = 120;
const SLOT: u32 = 16;

/// The bars of a chart of `slots` (a label, created, completed), scaled to
/// the tallest, which is returned too.
fn chart(slots: &[(String, u64, u64)]) -> (Vec<Bar>, u64) {
    let peak = slots
        .iter()
        .map(|(_, c, d)| (*c).max(*d))
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = |n: u64| ((n * u64::from(CHART_HEIGHT)) / peak) as u32;
    let width = 24 * SLOT / slots.len().max(1) as u32;
    let bars = slots
        .iter()
        .enumerate()
        .map(|(i, (label, created, completed))| {
            let (ch, dh) = (scale(*created), scale(*completed));
            Bar {
                x: i as u32 * width + 2,
                created_y: CHART_HEIGHT - ch,
                created_h: ch,
                completed_y: CHART_HEIGHT - dh,
                completed_h: dh,
                label: format!("{label}: {created} created, {completed} completed"),
            }
        })
        .collect();
    (bars, peak)
}

/// The last `count` slots of `slot` (an hour or a day, UTC) up to `now`,
/// each labelled with its start in `label`'s format.
fn per_slot(
    hours: &[HourCount],
    now: DateTime<Utc>,
    slot: Duration,
    count: i32,
    label: &str,
) -> (Vec<Bar>, u64) {
    let current = now - Duration::seconds(now.timestamp() % slot.num_seconds());
    let slots: Vec<(String, u64, u64)> = (0..count)
        .rev()
        .map(|i| {
            let start = current - slot * i;
            let (created, completed) = hours
                .iter()
                .filter(|h| h.hour >= start && h.hour < start + slot)
                .fold((0, 0), |(c, d), h| (c + h.created, d + h.completed));
            (start.format(label).to_string(), created, completed)
        })
        .collect();
    chart(&slots)
}

/// The last 24 hours, an hour a slot.
fn bars(hours: &[HourCount], now: DateTime<Utc>) -> (Vec<Bar>, u64) {
    per_slot(hours, now, Duration::hours(1), 24, "%H:00 UTC")
}

/// The last 7 days (UTC), a day a slot.
fn days(hours: &[HourCount], now: DateTime<Utc>) -> (Vec<Bar>, u64) {
    per_slot(hours, now, Duration::days(1), 7, "%a %d %b")
}

async fn overview(c: Console) -> Result<Response, AppError> {
    let now = c.state.clock.now();
    let counts = c.state.store.task_counts().await?;
    let hours = c
        .state
        .store
        .tasks_per_hour(now - Duration::days(7))
        .await?;
    let day_start = now - Duration::hours(24);
    let sum = |since: DateTime<Utc>, f: fn(&HourCount) -> u64| -> u64 {
        hours.iter().filter(|h| h.hour >= since).map(f).sum()
    };
    let oldest = c.state.store.oldest_open_task().await?.map(|t| {
        let since = t.published_at.unwrap_or(t.created_at);
        (t.id, since.to_rfc3339(), age(now - since))
    });
    let (bars, peak) = bars(&hours, now);
    let (week_bars, week_peak) = days(&hours, now);
    let health = c.state.store.health().await?;
    let page = OverviewPage {
        nav: Some(Nav::of(&c)),
        total: counts.iter().map(|(_, n)| n).sum(),
        counts: TaskState::ALL
            .iter()
            .map(|s| {
                (
                    s.as_str(),
                    counts.iter().find(|(t, _)| t == s).map_or(0, |(_, n)| *n),
                )
            })
            .collect(),
        oldest,
        bars,
        week_bars,
        week_peak,
        day_created: sum(day_start, |h| h.created),
        day_completed: sum(day_start, |h| h.completed),
        week_created: sum(now - Duration::days(7), |h| h.created),
        week_completed: sum(now - Duration::days(7), |h| h.completed),
        peak,
        health,
    };
    Ok(html(&page))
}

/// `3 h 20 min`, `45 s`: how long, for people.
pub(super) fn age(d: TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min", s / 60),
        3600..86400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} d {} h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_has_24_hours_scaled_to_the_peak() {
        let now = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let this_hour = now - Duration::seconds(now.timestamp() % 3600);
        let hours = [HourCount {
            hour: this_hour,
            created: 4,
            completed: 2,
        }];
        let (bars, peak) = bars(&hours, now);
        assert_eq!((bars.len(), peak), (24, 4));
        let (week, week_peak) = days(&hours, now);
        assert_eq!((week.len(), week_peak), (7, 4));
        assert_eq!(week.last().unwrap().created_h, CHART_HEIGHT);
        let last = bars.last().unwrap();
        assert_eq!(
            (last.created_h, last.completed_h),
            (CHART_HEIGHT, CHART_HEIGHT / 2)
        );
        assert!(bars[..23].iter().all(|b| b.created_h == 0));
    }
}
