//! The operator's commands: `meatspace key …`, `meatspace invite …`,
//! `meatspace audit` and `meatspace worker list|suspend|reinstate`. They
//! act with the API key (`MEATSPACE_API_KEY`, scope `operator`), or with
//! the development key where the server still accepts it. A key's secret
//! is printed once, when it is created or rotated, and never stored.

use anyhow::Result;
use chrono::{DateTime, Utc};
use meatspace_client::types::{
    AuditEntry, AuditFilter, CreateKey, Grant, Key, KeySecret, PrincipalKind, PrincipalRef,
    Qualification, QualificationValue, Worker,
};
use uuid::Uuid;

use crate::Ctx;
use crate::args::{InviteCommand, KeyCommand, KindArg, Page, WorkerCommand};
use crate::output::{emit, escape_controls, one_line};

pub async fn key(ctx: &Ctx, cmd: KeyCommand) -> Result<()> {
    let keys = ctx.client(None)?.keys();
    let out = ctx.global.output;
    match cmd {
        KeyCommand::Create {
            name,
            kind,
            principal,
            scopes,
            expires_at,
        } => {
            let mut req = CreateKey::new(name);
            req.kind = Some(match kind {
                KindArg::Agent => PrincipalKind::Agent,
                KindArg::Operator => PrincipalKind::Operator,
            });
            req.principal_id = principal;
            req.scopes = (!scopes.is_empty()).then_some(scopes);
            req.expires_at = expires_at;
            let created = keys.create(&req).await?;
            emit(out, &created, || secret_text("created", &created))
        }
        KeyCommand::List { page } => {
            let listed = keys.list(page.cursor.as_deref(), Some(page.limit)).await?;
            emit(out, &listed, || {
                if listed.keys.is_empty() {
                    return "no API keys (create one with `meatspace key create --name NAME`)"
                        .into();
                }
                let now = Utc::now();
                let mut s = format!(
                    "{:<32}  {:<20}  {:<8}  {:<24}  {:<20}  STATUS",
                    "ID", "NAME", "KIND", "PRINCIPAL", "SCOPES"
                );
                for k in &listed.keys {
                    s.push_str(&format!(
                        "\n{:<32}  {:<20}  {:<8}  {:<24}  {:<20}  {}",
                        k.id.simple(),
                        one_line(&k.name),
                        k.principal.kind.as_str(),
                        one_line(&k.principal.name),
                        scopes_text(k),
                        key_status(k, now)
                    ));
                }
                more(&mut s, "key list", listed.next_cursor.as_deref());
                s
            })
        }
        KeyCommand::Get { key_id } => {
            let key = keys.get(key_id).await?;
            emit(out, &key, || key_text(&key, Utc::now()))
        }
        KeyCommand::Rotate {
            key_id,
            grace_seconds,
        } => {
            let rotated = keys.rotate(key_id, grace_seconds).await?;
            emit(out, &rotated, || secret_text("rotated", &rotated))
        }
        KeyCommand::Revoke {
            key_id,
            cancel_tasks,
        } => {
            let revoked = keys.revoke(key_id, cancel_tasks).await?;
            emit(out, &revoked, || {
                let mut s = format!("revoked {}", key_text(&revoked.key, Utc::now()));
                if cancel_tasks {
                    s.push_str(&format!(
                        "\ncancelled {} task(s) of {}",
                        revoked.cancelled_tasks,
                        principal_text(&revoked.key.principal)
                    ));
                } else {
                    s.push_str(
                        "\nits tasks keep running (their task tokens still work); \
                         `--cancel-tasks` also cancels them",
                    );
                }
                s
            })
        }
    }
}

pub async fn invite(ctx: &Ctx, cmd: InviteCommand) -> Result<()> {
    let invites = ctx.client(None)?.invites();
    let out = ctx.global.output;
    match cmd {
        InviteCommand::List { page } => {
            let listed = invites
                .list(page.cursor.as_deref(), Some(page.limit))
                .await?;
            emit(out, &listed, || {
                if listed.invites.is_empty() {
                    return "no invites".into();
                }
                let now = Utc::now();
                let mut s = format!(
                    "{:<36}  {:<20}  {:<20}  {:<8}  CREATED BY",
                    "ID", "CREATED AT", "EXPIRES AT", "STATUS"
                );
                for i in &listed.invites {
                    s.push_str(&format!(
                        "\n{:<36}  {:<20}  {:<20}  {:<8}  {}",
                        i.id,
                        time(i.created_at),
                        time(i.expires_at),
                        i.state(now).as_str(),
                        i.created_by
                    ));
                }
                more(&mut s, "invite list", listed.next_cursor.as_deref());
                s
            })
        }
        InviteCommand::Revoke { invite_id } => {
            let invite = invites.revoke(invite_id).await?;
            emit(out, &invite, || {
                format!(
                    "revoked invite {} (created by principal {})",
                    invite.id, invite.created_by
                )
            })
        }
    }
}

/// `worker list|suspend|reinstate`.
pub async fn worker(ctx: &Ctx, cmd: WorkerCommand) -> Result<()> {
    let admin = ctx.client(None)?.workers_admin();
    let out = ctx.global.output;
    match cmd {
        WorkerCommand::List { page } => {
            let listed = admin.list(page.cursor.as_deref(), Some(page.limit)).await?;
            emit(out, &listed, || {
                if listed.workers.is_empty() {
                    return "no workers registered".into();
                }
                let mut s = format!("{:<36}  {:<20}  {:<20}  STATUS", "ID", "NAME", "CREATED AT");
                for w in &listed.workers {
                    s.push_str(&format!(
                        "\n{:<36}  {:<20}  {:<20}  {}",
                        w.id,
                        one_line(&w.name),
                        time(w.created_at),
                        worker_status(w)
                    ));
                }
                more(&mut s, "worker list", listed.next_cursor.as_deref());
                s
            })
        }
        WorkerCommand::Suspend { worker_id, reason } => {
            let w = admin.suspend(worker_id, reason.as_deref()).await?;
            emit(out, &w, || {
                format!(
                    "suspended worker {} ({}): its token and sessions are refused and the task \
                     it held reopens\nundo with: meatspace worker reinstate {}",
                    w.id,
                    one_line(&w.name),
                    w.id
                )
            })
        }
        WorkerCommand::Reinstate { worker_id } => {
            let w = admin.reinstate(worker_id).await?;
            emit(out, &w, || {
                format!("reinstated worker {} ({})", w.id, one_line(&w.name))
            })
        }
        WorkerCommand::Qualify {
            worker_id,
            name,
            value,
            expires_at,
        } => {
            let grant = Grant {
                value: value.as_deref().map(crate::args::qualification_value),
                expires_at,
            };
            let q = admin.qualify(worker_id, &name, &grant).await?;
            emit(out, &q, || {
                format!("worker {worker_id}: {}", qualification_text(&q))
            })
        }
        WorkerCommand::Unqualify { worker_id, name } => {
            let left = admin.unqualify(worker_id, &name).await?;
            emit(out, &left, || format!("worker {worker_id}: {name} revoked"))
        }
        WorkerCommand::Qualifications { worker_id } => {
            let list = admin.qualifications(worker_id).await?;
            emit(out, &list, || {
                if list.qualifications.is_empty() {
                    return format!("worker {worker_id} holds no qualifications");
                }
                let lines: Vec<String> =
                    list.qualifications.iter().map(qualification_text).collect();
                lines.join("\n")
            })
        }
        WorkerCommand::Block { worker_id, undo } => {
            let blocks = ctx.client(None)?.block(worker_id, !undo).await?;
            emit(out, &blocks, || match undo {
                false => format!("worker {worker_id} no longer sees or claims your tasks"),
                true => format!("worker {worker_id} may take your tasks again"),
            })
        }
        _ => unreachable!("worker::run passes only the operator's commands"),
    }
}

/// One grant for people: `name = value (until T)`.
fn qualification_text(q: &Qualification) -> String {
    let mut s = escape_controls(&q.name);
    match &q.value {
        Some(QualificationValue::Integer(n)) => s.push_str(&format!(" = {n}")),
        Some(QualificationValue::Text(t)) => s.push_str(&format!(" = {}", escape_controls(t))),
        None => {}
    }
    if let Some(until) = q.expires_at {
        s.push_str(&format!(" (until {})", time(until)));
    }
    s
}

pub async fn audit(
    ctx: &Ctx,
    principal: Option<Uuid>,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    page: Page,
) -> Result<()> {
    let filter = AuditFilter {
        principal,
        since,
        until,
        limit: Some(page.limit),
        cursor: page.cursor,
    };
    let listed = ctx.client(None)?.audit(&filter).await?;
    emit(ctx.global.output, &listed, || {
        if listed.entries.is_empty() {
            return "no audit entries match".into();
        }
        let mut s = String::new();
        for e in &listed.entries {
            if !s.is_empty() {
                s.push('\n');
            }
            s.push_str(&entry_text(e));
        }
        more(&mut s, "audit", listed.next_cursor.as_deref());
        s
    })
}

/// A key and its secret, said once with what to do with it.
fn secret_text(verb: &str, k: &KeySecret) -> String {
    let mut s = format!(
        "{verb} {}\nsecret (shown only now; the CLI stores it nowhere): {}",
        key_text(&k.key, Utc::now()),
        k.secret
    );
    if let Some(until) = k.key.previous_valid_until {
        s.push_str(&format!(
            "\nthe previous secret keeps working until {}",
            until.to_rfc3339()
        ));
    }
    s.push_str("\nits user sets it as MEATSPACE_API_KEY (or passes --api-key)");
    s
}

fn key_text(k: &Key, now: DateTime<Utc>) -> String {
    let mut s = format!(
        "key {} \"{}\"  {}\n  principal:  {}\n  scopes:     {}\n  created at: {}",
        k.id.simple(),
        one_line(&k.name),
        key_status(k, now),
        principal_text(&k.principal),
        scopes_text(k),
        k.created_at.to_rfc3339()
    );
    let optional = [
        ("expires at", k.expires_at),
        ("last used", k.last_used_at),
        ("rotated at", k.rotated_at),
        ("old secret until", k.previous_valid_until),
        ("revoked at", k.revoked_at),
    ];
    for (label, at) in optional {
        if let Some(at) = at {
            s.push_str(&format!("\n  {label}: {}", at.to_rfc3339()));
        }
    }
    s
}

fn scopes_text(k: &Key) -> String {
    let names: Vec<&str> = k.scopes.iter().map(|s| s.as_str()).collect();
    names.join(",")
}

fn principal_text(p: &PrincipalRef) -> String {
    format!("{} {} ({})", p.kind.as_str(), one_line(&p.name), p.id)
}

/// Whether a key works now, as one word (and when its old secret ends).
fn key_status(k: &Key, now: DateTime<Utc>) -> String {
    if k.revoked_at.is_some() {
        "revoked".into()
    } else if k.expires_at.is_some_and(|t| t <= now) {
        "expired".into()
    } else if let Some(until) = k.previous_valid_until.filter(|t| *t > now) {
        format!("active (old secret until {})", time(until))
    } else {
        "active".into()
    }
}

fn worker_status(w: &Worker) -> String {
    match w.suspended_at {
        Some(at) => format!("suspended since {}", time(at)),
        None => "active".into(),
    }
}

fn entry_text(e: &AuditEntry) -> String {
    let mut s = format!(
        "#{} {} {} {} by {}",
        e.id,
        time(e.at),
        e.action.as_str(),
        escape_controls(&e.target),
        principal_text(&e.principal)
    );
    if let Some(addr) = &e.address {
        s.push_str(&format!(" from {}", escape_controls(addr)));
    }
    if let Some(detail) = &e.detail {
        s.push_str(&format!("\n  {}", escape_controls(&detail.to_string())));
    }
    s
}

fn time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn more(s: &mut String, command: &str, next: Option<&str>) {
    if let Some(next) = next {
        s.push_str(&format!(
            "\nmore: meatspace {command} --cursor {}",
            escape_controls(next)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meatspace_client::types::Scope;

    fn key(at: &str) -> Key {
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().to_utc();
        Key {
            id: Uuid::new_v4(),
            name: "billing\x1b[2J".into(),
            principal: PrincipalRef {
                id: Uuid::new_v4(),
                kind: PrincipalKind::Agent,
                name: "billing".into(),
            },
            scopes: vec![Scope::Tasks, Scope::RegisterWorkers].into(),
            created_at: t(at),
            expires_at: None,
            last_used_at: None,
            revoked_at: None,
            rotated_at: None,
            previous_valid_until: None,
        }
    }

    #[test]
    fn a_key_status_says_whether_it_works_now() {
        let now = DateTime::parse_from_rfc3339("2030-01-10T00:00:00Z")
            .unwrap()
            .to_utc();
        let mut k = key("2030-01-01T00:00:00Z");
        assert_eq!(key_status(&k, now), "active");
        k.previous_valid_until = Some(now + chrono::TimeDelta::hours(1));
        assert_eq!(
            key_status(&k, now),
            "active (old secret until 2030-01-10T01:00:00Z)"
        );
        k.previous_valid_until = Some(now - chrono::TimeDelta::hours(1));
        assert_eq!(key_status(&k, now), "active", "the grace period is over");
        k.expires_at = Some(now);
        assert_eq!(key_status(&k, now), "expired");
        k.revoked_at = Some(now);
        assert_eq!(key_status(&k, now), "revoked");
    }

    #[test]
    fn key_text_escapes_names_and_lists_scopes() {
        let k = key("2030-01-01T00:00:00Z");
        let s = key_text(&k, Utc::now());
        assert!(!s.contains('\x1b'), "{s}");
        assert!(s.contains("scopes:     tasks,workers:register"), "{s}");
        assert!(s.contains(&k.id.simple().to_string()), "{s}");
    }
}
